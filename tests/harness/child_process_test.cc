#include "tests/harness/child_process.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace muonps {
namespace testing {
namespace {

std::string LogPath(const std::string& name) {
  const char* dir = getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The child sees this process's environment with `env` set over it: a new
// name added, an inherited one replaced (and not passed twice), the rest
// as they are.
TEST(ChildProcessTest, EnvSetsOverThisProcesssEnvironment) {
  ASSERT_EQ(setenv("MUONPS_CHILD_KEPT", "kept", 1), 0);
  ASSERT_EQ(setenv("MUONPS_CHILD_REPLACED", "before", 1), 0);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      {"/bin/sh", "-c",
       "echo \"added=$MUONPS_CHILD_ADDED replaced=$MUONPS_CHILD_REPLACED "
       "kept=$MUONPS_CHILD_KEPT\"; env | grep -c '^MUONPS_CHILD_REPLACED='"},
      LogPath("env.log"),
      {"MUONPS_CHILD_ADDED=a=b", "MUONPS_CHILD_REPLACED=after"});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> status = (*child)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  EXPECT_EQ((*child)->Log(), "added=a=b replaced=after kept=kept\n1\n");
}

TEST(ChildProcessTest, AnEnvEntryWithoutAnEqualsSignIsRefusedNamingIt) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      {"/bin/true"}, LogPath("refused.log"), {"MUONPS_CHILD_NO_VALUE"});
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(child.status().message().find("MUONPS_CHILD_NO_VALUE"),
            std::string::npos)
      << child.status();
}

}  // namespace
}  // namespace testing
}  // namespace muonps
