// Writes the fuzz targets' seed corpora: fuzz/corpus/<target>/<seed> under
// the directory given (bazel run //fuzz:write_seeds -- $PWD/fuzz/corpus).
// Each seed is a short, valid session of its surface, so the fuzzers start
// past the parsers' first checks; plans come from the real coordinator
// state, as workers receive them.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "fuzz/seed_sessions.h"
#include "server/worker/checkpoint_manifest.h"
#include "transport/wire_format.h"

namespace muonps {
namespace fuzz {
namespace {

class SeedWriter {
 public:
  explicit SeedWriter(std::string root) : root_(std::move(root)) {}

  // Writes `bytes` as root/target/name; false (and a message) on failure.
  bool Write(const std::string& target, const std::string& name,
             const std::string& bytes) {
    const std::string dir = absl::StrCat(root_, "/", target);
    mkdir(root_.c_str(), 0755);
    mkdir(dir.c_str(), 0755);
    std::ofstream out(absl::StrCat(dir, "/", name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
      ok_ = false;
    }
    return ok_;
  }
  bool ok() const { return ok_; }

 private:
  std::string root_;
  bool ok_ = true;
};

void WriteWireSeeds(SeedWriter* out) {
  using namespace transport;
  Handshake hello;
  hello.session = 7;
  hello.from_rank = 1;
  hello.world_size = 2;
  unsigned char handshake[kHandshakeBytes];
  EncodeHandshake(hello, handshake);
  std::string bytes(reinterpret_cast<char*>(handshake), kHandshakeBytes);
  const MessageKind kinds[] = {MessageKind::kPointToPoint, MessageKind::kReduce,
                               MessageKind::kBroadcast};
  for (int i = 0; i < 3; ++i) {
    unsigned char header[kFrameHeaderBytes];
    EncodeFrameHeader(
        {.kind = kinds[i], .sequence = static_cast<uint64_t>(i), .bytes = 4096},
        header);
    bytes.append(reinterpret_cast<char*>(header), kFrameHeaderBytes);
  }
  out->Write("wire_format_fuzzer", "hello_and_frames", bytes);
  hello.verdict = HandshakeVerdict::kWrongSession;
  EncodeHandshake(hello, handshake);
  out->Write("wire_format_fuzzer", "verdict_wrong_session",
             std::string(reinterpret_cast<char*>(handshake), kHandshakeBytes));
}

// A real manifest of two tensors, whole and without its CRC (the fuzzer
// appends one), so both of its tries start from valid bytes.
void WriteCheckpointSeeds(SeedWriter* out) {
  CheckpointManifest manifest;
  manifest.step = 12;
  manifest.plan_version = 3;
  manifest.worker_id = "w0";
  manifest.data_bytes = 4 * (64 * 32 + 3 * 16 * 8);
  CheckpointTensor a;
  a.name = "layers.0.q";
  a.rows = 64;
  a.cols = 32;
  a.offset = 0;
  a.length = 4 * 64 * 32;
  CheckpointTensor b;
  b.name = "moe.w1";
  b.expert = 2;
  b.rows = 16;
  b.cols = 8;
  b.offset = a.length;
  b.length = 4 * 16 * 8;
  manifest.tensors = {a, b};
  const std::string bytes = SerializeCheckpointManifest(manifest);
  out->Write("checkpoint_manifest_fuzzer", "two_tensors", bytes);
  out->Write("checkpoint_manifest_fuzzer", "two_tensors_body",
             bytes.substr(0, bytes.size() - 4));
}

}  // namespace
}  // namespace fuzz
}  // namespace muonps

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT\n", argv[0]);
    return 2;
  }
  using namespace muonps::fuzz;
  SeedWriter out(argv[1]);
  WriteWireSeeds(&out);
  WriteCheckpointSeeds(&out);
  for (const NamedSeed& seed : CoordinatorSeeds()) {
    out.Write("coordinator_rpc_fuzzer", seed.name, seed.bytes);
  }
  for (const NamedSeed& seed : PlanDecoderSeeds()) {
    out.Write("plan_decoder_fuzzer", seed.name, seed.bytes);
  }
  for (const NamedSeed& seed : WorkerSeeds()) {
    out.Write("worker_rpc_fuzzer", seed.name, seed.bytes);
  }
  for (const NamedSeed& seed : CAbiSeeds()) {
    out.Write("c_abi_fuzzer", seed.name, seed.bytes);
  }
  return out.ok() ? 0 : 1;
}
