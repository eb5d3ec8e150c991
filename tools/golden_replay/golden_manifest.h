// Reads a golden-trajectory manifest in the format of
// testdata/torch_optim_golden (its README describes it): a
// manifest.json listing cases of kind "muon", "adamw" or "newton_schulz",
// with raw little-endian row-major float32 tensors beside it.
//
// Loading validates everything up front (kinds, shapes, hyperparameters,
// file names) and fails with a status naming the case and field; tensor
// files are read lazily with ReadTensor. Thread-compatible.
#ifndef MUONPS_TOOLS_GOLDEN_REPLAY_GOLDEN_MANIFEST_H_
#define MUONPS_TOOLS_GOLDEN_REPLAY_GOLDEN_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/muon_kernels.h"

namespace muonps {
namespace golden {

enum class CaseKind { kMuon, kAdamW, kNewtonSchulz };

absl::string_view CaseKindName(CaseKind kind);

struct GoldenStep {
  std::string grad;      // gradient fed into this step
  std::string param;     // parameter after this step
  std::string momentum;  // momentum after this step (muon only)
};

struct GoldenCase {
  CaseKind kind = CaseKind::kMuon;
  std::string name;
  std::vector<int64_t> shape;
  // kMuon / kAdamW: the initial parameter and the steps.
  std::string p0;
  std::vector<GoldenStep> steps;
  kernels::MuonHyperparameters muon;
  kernels::AdamWHyperparameters adamw;
  // kNewtonSchulz: one input and torch's output.
  std::string input;
  std::string output;
  NewtonSchulzOptions ns;

  int64_t elements() const;
  // Matrix view of `shape`: [rows, cols] with batch = product of leading
  // dimensions (a 3-D expert stack is a batch).
  int64_t batch() const;
  int64_t rows() const;
  int64_t cols() const;
};

struct GoldenManifest {
  std::string dir;
  std::string source;
  std::vector<GoldenCase> cases;
};

// Parses `dir`/manifest.json. NOT_FOUND if it is missing; INVALID_ARGUMENT
// naming the case and field for malformed content.
absl::StatusOr<GoldenManifest> LoadGoldenManifest(const std::string& dir);

// Reads `dir`/`file` as `elements` float32 values. NOT_FOUND if missing,
// DATA_LOSS naming the file if its size is not elements * 4 bytes.
absl::StatusOr<std::vector<float>> ReadTensor(const std::string& dir,
                                              const std::string& file,
                                              int64_t elements);

}  // namespace golden
}  // namespace muonps

#endif  // MUONPS_TOOLS_GOLDEN_REPLAY_GOLDEN_MANIFEST_H_
