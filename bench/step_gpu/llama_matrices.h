// What step_gpu_bench's runs share: the matrix sets (Llama-3-8B layers: per
// layer q, k, v, o, gate, up, down, 1.74 B parameters in 8 layers;
// GPT-2-small blocks; or DeepSeek-V3-like MoE layers), the median of timings,
// and printing one JSON line. Pure functions.
#ifndef MUONPS_BENCH_STEP_GPU_LLAMA_MATRICES_H_
#define MUONPS_BENCH_STEP_GPU_LLAMA_MATRICES_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace bench {

struct Shape {
  int64_t rows, cols;
};

// One matrix of a set: its name, shape and layer (the bucket order key).
struct BenchMatrix {
  std::string name;
  Shape shape;
  int32_t layer = 0;
};
using MatrixSet = std::vector<BenchMatrix>;

// `layers` Llama-3-8B layers' matrices (names "layers.L.q" ..., layer
// order), every dimension divided by `divisor` (a quick logic check).
inline MatrixSet LlamaMatrices(int layers, int divisor) {
  const int d = divisor;
  const std::vector<Shape> layer = {
      {4096 / d, 4096 / d}, {1024 / d, 4096 / d},  {1024 / d, 4096 / d},
      {4096 / d, 4096 / d}, {14336 / d, 4096 / d}, {14336 / d, 4096 / d},
      {4096 / d, 14336 / d}};
  const char* names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  MatrixSet matrices;
  for (int l = 0; l < layers; ++l) {
    for (size_t i = 0; i < layer.size(); ++i) {
      matrices.push_back(
          {absl::StrCat("layers.", l, ".", names[i]), layer[i], l});
    }
  }
  return matrices;
}

// `layers` GPT-2-small blocks (width 768): per block the attention's
// fused q/k/v projection (2304x768) and output projection (768x768), the
// MLP's 3072x768 and 768x3072; 12 blocks hold 85 M matrix parameters. A
// model whose step is small, where what a step costs regardless of size
// shows. Dimensions divided by `divisor`.
inline MatrixSet Gpt2SmallMatrices(int layers, int divisor) {
  const int64_t d = divisor;
  const std::vector<std::pair<const char*, Shape>> block = {
      {"attn.c_attn", {2304 / d, 768 / d}},
      {"attn.c_proj", {768 / d, 768 / d}},
      {"mlp.c_fc", {3072 / d, 768 / d}},
      {"mlp.c_proj", {768 / d, 3072 / d}}};
  MatrixSet matrices;
  for (int l = 0; l < layers; ++l) {
    for (const auto& [name, shape] : block) {
      matrices.push_back({absl::StrCat("h.", l, ".", name), shape, l});
    }
  }
  return matrices;
}

// `layers` DeepSeek-V3-like MoE layers (hidden 7168, 128 heads): the MLA
// attention projections (q_a 1536x7168, q_b 24576x1536, kv_a 576x7168,
// kv_b 32768x512, o 7168x16384), then one shared and `experts` routed
// experts (gate and up 2048x7168, down 7168x2048), each expert matrix a 2-D
// parameter of its own as torch.optim.Muon takes them. DeepSeek-V3 has 256
// routed experts per layer (11.3 B parameters); `experts` scales that down
// to fit. Dimensions divided by `divisor`.
inline MatrixSet MoeMatrices(int layers, int experts, int divisor) {
  const int64_t d = divisor;
  const std::vector<std::pair<const char*, Shape>> attention = {
      {"q_a", {1536 / d, 7168 / d}},
      {"q_b", {24576 / d, 1536 / d}},
      {"kv_a", {576 / d, 7168 / d}},
      {"kv_b", {32768 / d, 512 / d}},
      {"o", {7168 / d, 16384 / d}}};
  const std::vector<std::pair<const char*, Shape>> expert = {
      {"gate", {2048 / d, 7168 / d}},
      {"up", {2048 / d, 7168 / d}},
      {"down", {7168 / d, 2048 / d}}};
  MatrixSet matrices;
  for (int l = 0; l < layers; ++l) {
    for (const auto& [name, shape] : attention) {
      matrices.push_back(
          {absl::StrCat("layers.", l, ".attn.", name), shape, l});
    }
    for (int e = 0; e <= experts; ++e) {
      const std::string who =
          e == 0 ? "shared" : absl::StrCat("experts.", e - 1);
      for (const auto& [name, shape] : expert) {
        matrices.push_back(
            {absl::StrCat("layers.", l, ".", who, ".", name), shape, l});
      }
    }
  }
  return matrices;
}

// One JSON line on stdout, flushed.
inline void PrintLine(const nlohmann::ordered_json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

// `t` in ms on the steady clock (CLOCK_MONOTONIC on Linux, which the
// workers' timelines give their rounds' beginnings on: began_at_ms).
inline double SteadyClockMs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t.time_since_epoch())
      .count();
}

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_GPU_LLAMA_MATRICES_H_
