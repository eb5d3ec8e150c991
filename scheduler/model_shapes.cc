#include "scheduler/model_shapes.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace scheduler {
namespace {

MatrixSpec Matrix(std::string name, int64_t rows, int64_t cols, int layer,
                  int64_t experts = 1) {
  MatrixSpec m;
  m.name = std::move(name);
  m.rows = rows;
  m.cols = cols;
  m.experts = experts;
  m.dtype = DType::kBFloat16;
  m.layout = Layout::kUnreduced;
  m.layer = layer;
  return m;
}

}  // namespace

std::vector<MatrixSpec> Llama3_8B(int layers) {
  std::vector<MatrixSpec> out;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    out.push_back(Matrix(p + "attn.q", 4096, 4096, l));
    out.push_back(Matrix(p + "attn.k", 1024, 4096, l));
    out.push_back(Matrix(p + "attn.v", 1024, 4096, l));
    out.push_back(Matrix(p + "attn.o", 4096, 4096, l));
    out.push_back(Matrix(p + "mlp.gate", 14336, 4096, l));
    out.push_back(Matrix(p + "mlp.up", 14336, 4096, l));
    out.push_back(Matrix(p + "mlp.down", 4096, 14336, l));
  }
  return out;
}

std::vector<MatrixSpec> DeepSeekV3Like() {
  std::vector<MatrixSpec> out;
  for (int l = 0; l < 61; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    out.push_back(Matrix(p + "attn.q_a", 1536, 7168, l));
    out.push_back(Matrix(p + "attn.q_b", 24576, 1536, l));
    out.push_back(Matrix(p + "attn.kv_a", 576, 7168, l));
    out.push_back(Matrix(p + "attn.kv_b", 32768, 512, l));
    out.push_back(Matrix(p + "attn.o", 7168, 16384, l));
    if (l < 3) {
      out.push_back(Matrix(p + "mlp.gate", 18432, 7168, l));
      out.push_back(Matrix(p + "mlp.up", 18432, 7168, l));
      out.push_back(Matrix(p + "mlp.down", 7168, 18432, l));
      continue;
    }
    out.push_back(Matrix(p + "moe.experts.gate", 2048, 7168, l, 256));
    out.push_back(Matrix(p + "moe.experts.up", 2048, 7168, l, 256));
    out.push_back(Matrix(p + "moe.experts.down", 7168, 2048, l, 256));
    out.push_back(Matrix(p + "moe.shared.gate", 2048, 7168, l));
    out.push_back(Matrix(p + "moe.shared.up", 2048, 7168, l));
    out.push_back(Matrix(p + "moe.shared.down", 7168, 2048, l));
    out.push_back(Matrix(p + "moe.router", 256, 7168, l));
  }
  return out;
}

std::vector<MatrixSpec> RandomShapes(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dim(1, 128);
  std::vector<MatrixSpec> out;
  for (int i = 0; i < count; ++i) {
    out.push_back(
        Matrix(absl::StrCat("m", i), 64 * dim(rng), 64 * dim(rng), i / 8));
  }
  return out;
}

}  // namespace scheduler
}  // namespace muonps
