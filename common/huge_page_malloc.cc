#include "common/huge_page_malloc.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace muonps {

void RestartWithHugePageMalloc(char** argv) {
  constexpr char kName[] = "GLIBC_TUNABLES";
  constexpr char kTunable[] = "glibc.malloc.hugetlb";
  const char* now = std::getenv(kName);
  std::string tunables = now == nullptr ? "" : now;
  if (tunables.find(kTunable) != std::string::npos) return;
  if (!tunables.empty()) tunables += ':';
  tunables += kTunable;
  tunables += "=1";
  if (setenv(kName, tunables.c_str(), /*overwrite=*/1) != 0) return;
  execv("/proc/self/exe", argv);
  // The exec failed: run on as started, without the tunable in the
  // environment of anything this program starts.
  if (now == nullptr) {
    unsetenv(kName);
  } else {
    setenv(kName, now, 1);
  }
}

}  // namespace muonps
