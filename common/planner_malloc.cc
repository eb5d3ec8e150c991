#include "common/planner_malloc.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace muonps {

void RestartWithPlannerMalloc(char** argv) {
  constexpr char kName[] = "GLIBC_TUNABLES";
  const char* now = std::getenv(kName);
  const std::string before = now == nullptr ? "" : now;
  std::string tunables = before;
  for (const char* tunable :
       {"glibc.malloc.hugetlb=1", "glibc.malloc.arena_max=1"}) {
    const std::string name(tunable, std::string(tunable).find('='));
    if (before.find(name + "=") != std::string::npos) continue;
    if (!tunables.empty()) tunables += ':';
    tunables += tunable;
  }
  if (tunables == before) return;
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
