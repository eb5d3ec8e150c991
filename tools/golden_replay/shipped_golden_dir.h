// ShippedGoldenDir, where a test finds the shipped PyTorch golden folder in
// its runfiles (golden_replay_test, golden_manifest_shipped_test; their
// BUILD targets carry //testdata/torch_optim_golden:files as data). Tests
// only (testonly in BUILD).
#ifndef MUONPS_TOOLS_GOLDEN_REPLAY_SHIPPED_GOLDEN_DIR_H_
#define MUONPS_TOOLS_GOLDEN_REPLAY_SHIPPED_GOLDEN_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace muonps {
namespace golden {

// The shipped golden folder in this test's runfiles, or "" if absent.
inline std::string ShippedGoldenDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) return "";
  const std::string dir =
      std::string(srcdir) + "/muonps/testdata/torch_optim_golden";
  return std::filesystem::exists(dir + "/manifest.json") ? dir : "";
}

}  // namespace golden
}  // namespace muonps

#endif  // MUONPS_TOOLS_GOLDEN_REPLAY_SHIPPED_GOLDEN_DIR_H_
