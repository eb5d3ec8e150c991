#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/sanitizer.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

std::string Probe() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir, "/", workspace, "/common/planner_malloc_probe");
}

// Runs the probe (common/planner_malloc_probe.cc, which calls
// RestartWithPlannerMalloc) under env(1) with `env` as its arguments, and
// returns the probe's lines.
std::vector<std::string> RunProbe(const std::string& env) {
  FILE* out = popen(absl::StrCat("env ", env, " ", Probe()).c_str(), "r");
  EXPECT_NE(out, nullptr);
  std::vector<std::string> lines;
  char line[512];
  while (out != nullptr && std::fgets(line, sizeof(line), out) != nullptr) {
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    lines.push_back(text);
  }
  if (out != nullptr) {
    EXPECT_EQ(pclose(out), 0);
  }
  return lines;
}

// What RestartWithPlannerMalloc adds.
constexpr char kAdded[] =
    "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:"
    "glibc.malloc.mmap_max=0:"
    "glibc.malloc.trim_threshold=1073741824";

bool TransparentHugePagesOn() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream text;
  text << in.rdbuf();
  return in.good() && text.str().find("[never]") == std::string::npos;
}

TEST(PlannerMallocTest, RestartsOnceWithTheTunablesAdded) {
  const std::vector<std::string> lines = RunProbe("-u GLIBC_TUNABLES");
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  const std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
  const std::vector<std::string> second = absl::StrSplit(lines[1], ' ');
  const std::vector<std::string> running = absl::StrSplit(lines[2], ' ');
  ASSERT_EQ(running.size(), 5u) << lines[2];
  EXPECT_EQ(first[0], "started");
  EXPECT_EQ(second, first) << "the same process, executed again";
  EXPECT_EQ(running[1], first[1]);
  EXPECT_EQ(running[2], kAdded);
  // ASan's malloc is not glibc's.
  if (TransparentHugePagesOn() && !kAddressSanitizer) {
    EXPECT_GT(std::stol(running[3]), 0) << "no huge pages: " << lines[2];
  }
}

TEST(PlannerMallocTest, KeepsTheOtherTunables) {
  const std::vector<std::string> lines =
      RunProbe("GLIBC_TUNABLES=glibc.rtld.optional_static_tls=2048");
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[2], ' '))[2],
            absl::StrCat("glibc.rtld.optional_static_tls=2048:", kAdded));
}

// An environment that tunes glibc's malloc itself is left as it is.
TEST(PlannerMallocTest, OwnMallocSettingsAreKeptAndNothingRestarts) {
  for (const char* own :
       {"glibc.malloc.hugetlb=0", "glibc.malloc.arena_max=4",
        "glibc.rtld.optional_static_tls=2048:glibc.malloc.tcache_count=0"}) {
    const std::vector<std::string> lines =
        RunProbe(absl::StrCat("GLIBC_TUNABLES=", own));
    ASSERT_EQ(lines.size(), 2u) << absl::StrJoin(lines, "\n");
    const std::vector<std::string> running = absl::StrSplit(lines[1], ' ');
    ASSERT_EQ(running.size(), 5u) << lines[1];
    EXPECT_EQ(running[2], own);
  }
}

}  // namespace
}  // namespace muonps
