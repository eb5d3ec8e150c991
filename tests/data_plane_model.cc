// The data-plane tests' models and data: SmallModel and MixedModel, the
// deterministic InitialParam and Gradient, and the buffer layout arithmetic
// the fixture's files share (data_plane_fixture_internal.h).
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tests/data_plane_fixture.h"
#include "tests/data_plane_fixture_internal.h"

namespace muonps {
namespace testing {
namespace {

using scheduler::Layout;

// splitmix64's finalizer, folded over the parts.
uint64_t Hash(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t p : parts) {
    h ^= p;
    h += 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

}  // namespace

int64_t FullIndex(int64_t i, int64_t rows, int64_t cols, int64_t begin,
                  int64_t end, int64_t first_expert) {
  const int64_t local = (end - begin) * cols;
  return (first_expert + i / local) * rows * cols + begin * cols + i % local;
}

bool ShardedParam(const MatrixDecl& m) {
  return m.options.layout == Layout::kRowSharded && m.options.shard_params;
}

ModelDecl SmallModel(Layout layout, bool shard_params, bool shard_experts) {
  ModelDecl model;
  const MatrixDeclOptions o{.layout = layout, .shard_params = shard_params};
  auto with = [o, shard_experts](int32_t layer, int64_t experts) {
    MatrixDeclOptions out = o;
    out.layer = layer;
    out.experts = experts;
    out.shard_experts = shard_experts && experts > 1;
    return out;
  };
  model.matrices = {
      {"layers.0.attn.qkv", 64, 64, with(0, 1)},
      {"layers.0.mlp.up", 48, 32, with(0, 1)},
      {"layers.1.mlp.down", 32, 80, with(1, 1)},
      {"layers.2.moe.experts", 40, 24, with(2, 3)},
      {"layers.2.attn.out", 64, 64, with(2, 1)},
  };
  model.tensors = {
      {"layers.0.norm.bias", 64, Layout::kUnreduced},
      {"head.bias", 80, Layout::kReplicated},
  };
  model.muon.lr = 0.02;
  model.muon.weight_decay = 0.1;
  model.muon.momentum = 0.9;
  model.muon.nesterov = true;
  model.adamw.lr = 0.01;
  model.adamw.weight_decay = 0.01;
  return model;
}

ModelDecl MixedModel() {
  ModelDecl model = SmallModel(Layout::kReplicated);
  model.matrices[1].options.layout = Layout::kUnreduced;
  model.matrices[2].options.layout = Layout::kRowSharded;
  model.matrices[3].options.layout = Layout::kRowSharded;
  model.matrices[3].options.shard_params = false;
  model.matrices[4].options.layout = Layout::kUnreduced;
  model.muon.nesterov = false;
  model.muon.lr = 0.01;
  model.muon.lr_adjustment = kernels::LrAdjustment::kMatchRmsAdamW;
  return model;
}

float InitialParam(int tensor, int64_t index) {
  const uint64_t h =
      Hash({1, static_cast<uint64_t>(tensor), static_cast<uint64_t>(index)});
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) / 20000.0f;
}

float Gradient(int tensor, int64_t step, int rank, int64_t index) {
  const uint64_t h =
      Hash({2, static_cast<uint64_t>(tensor), static_cast<uint64_t>(step),
            static_cast<uint64_t>(rank + 1), static_cast<uint64_t>(index)});
  return static_cast<float>(static_cast<int64_t>(h % 2049) - 1024) / 1024.0f;
}

}  // namespace testing
}  // namespace muonps
