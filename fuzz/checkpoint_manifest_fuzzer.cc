// libFuzzer target: the checkpoint manifest reader
// (server/worker/checkpoint_manifest.h), which reads bytes from disk and
// trusts none of them. Each input is tried twice: as it is (mostly stopped
// by the trailing CRC), and as a manifest body with a correct CRC appended,
// so that every field check is reached. Whatever parses must serialize back
// to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "server/worker/checkpoint_manifest.h"

namespace {

void Check(absl::string_view bytes) {
  absl::StatusOr<muonps::CheckpointManifest> manifest =
      muonps::ParseCheckpointManifest(bytes);
  if (!manifest.ok()) return;
  if (muonps::SerializeCheckpointManifest(*manifest) != bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  std::string sealed(bytes);
  const uint32_t crc = muonps::Crc32c(sealed);
  for (int i = 0; i < 4; ++i) {
    sealed.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  }
  Check(sealed);
  return 0;
}
