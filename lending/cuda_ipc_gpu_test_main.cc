// main() of the cuda_ipc GPU tests: run as `--ipc_child=MODE ARGS...`,
// the binary is the importing child (cuda_ipc_gpu_test_child.h); else it
// runs its tests.
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lending/cuda_ipc_gpu_test_child.h"

int main(int argc, char** argv) {
  const size_t flag_length = std::strlen(muonps::ipc_test::kChildFlag);
  if (argc >= 2 &&
      std::strncmp(argv[1], muonps::ipc_test::kChildFlag, flag_length) == 0) {
    return muonps::ipc_test::RunIpcChild(
        argv[1] + flag_length, std::vector<std::string>(argv + 2, argv + argc));
  }
  // A child that dies early must fail a write, not kill the test.
  signal(SIGPIPE, SIG_IGN);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
