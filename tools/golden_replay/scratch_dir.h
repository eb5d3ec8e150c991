// ScratchDir, the temporary folder the golden manifest tests write their
// manifests and tensors into (golden_manifest_malformed_test,
// golden_read_tensor_test). Tests only (testonly in BUILD).
#ifndef MUONPS_TOOLS_GOLDEN_REPLAY_SCRATCH_DIR_H_
#define MUONPS_TOOLS_GOLDEN_REPLAY_SCRATCH_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace muonps {
namespace golden {
namespace manifest_test {

namespace fs = std::filesystem;

// A fresh directory under TEST_TMPDIR, removed with everything in it when
// the object goes out of scope.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/golden_manifest.XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }

  // "" if the directory could not be created.
  const std::string& path() const { return path_; }

  // Writes `bytes` to path()/`name`; false on failure.
  bool Write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path_ + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return static_cast<bool>(out);
  }

 private:
  std::string path_;
};

}  // namespace manifest_test
}  // namespace golden
}  // namespace muonps

#endif  // MUONPS_TOOLS_GOLDEN_REPLAY_SCRATCH_DIR_H_
