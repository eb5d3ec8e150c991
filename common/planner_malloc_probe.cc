// Prints its process id before and after RestartWithPlannerMalloc, then
// GLIBC_TUNABLES and how many kB of its anonymous memory are on huge pages
// once it touched a 64 MiB malloc: what planner_malloc_test reads.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/planner_malloc.h"

int main(int /*argc*/, char** argv) {
  std::printf("started %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  muonps::RestartWithPlannerMalloc(argv);
  constexpr size_t kBytes = size_t{64} << 20;
  char* block = static_cast<char*>(std::malloc(kBytes));
  std::memset(block, 1, kBytes);
  long huge_kb = 0;
  std::ifstream smaps("/proc/self/smaps_rollup");
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("AnonHugePages:", 0) == 0) {
      huge_kb = std::atol(line.c_str() + std::strlen("AnonHugePages:"));
    }
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::printf("running %d %s %ld %d\n", static_cast<int>(getpid()),
              tunables == nullptr ? "-" : tunables, huge_kb, block[kBytes / 2]);
  std::free(block);
  return 0;
}
