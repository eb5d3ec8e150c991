#include "common/planner_malloc.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace muonps {

void RestartWithPlannerMalloc(char** argv) {
  constexpr char kName[] = "GLIBC_TUNABLES";
  constexpr char kTunables[] =
      "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:"
      "glibc.malloc.mmap_max=0:"
      "glibc.malloc.trim_threshold=1073741824";
  const char* now = std::getenv(kName);
  const std::string before = now == nullptr ? "" : now;
  if (before.find("glibc.malloc.") != std::string::npos) return;
  const std::string tunables =
      before.empty() ? kTunables : before + ":" + kTunables;
  if (setenv(kName, tunables.c_str(), /*overwrite=*/1) != 0) return;
  execv("/proc/self/exe", argv);
  // The exec failed: run on as started, without the tunables in the
  // environment of anything this program starts.
  if (now == nullptr) {
    unsetenv(kName);
  } else {
    setenv(kName, before.c_str(), 1);
  }
}

}  // namespace muonps
