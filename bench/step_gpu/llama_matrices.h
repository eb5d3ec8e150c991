// What step_gpu_bench's runs share: the 8-layer Llama-3-8B matrix set (per
// layer q, k, v, o, gate, up, down; 1.74 B parameters at divisor 1), the
// median of timings, and printing one JSON line. Pure functions.
#ifndef MUONPS_BENCH_STEP_GPU_LLAMA_MATRICES_H_
#define MUONPS_BENCH_STEP_GPU_LLAMA_MATRICES_H_

#include <algorithm>
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

// Matrices of one layer, in order.
constexpr int kMatricesPerLayer = 7;

// `layers` layers' matrices (names "layers.L.q" ..., layer order), every
// dimension divided by `divisor` (a quick logic check).
inline std::vector<std::pair<std::string, Shape>> LlamaMatrices(int layers,
                                                                int divisor) {
  const int d = divisor;
  const std::vector<Shape> layer = {
      {4096 / d, 4096 / d}, {1024 / d, 4096 / d},  {1024 / d, 4096 / d},
      {4096 / d, 4096 / d}, {14336 / d, 4096 / d}, {14336 / d, 4096 / d},
      {4096 / d, 14336 / d}};
  const char* names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  std::vector<std::pair<std::string, Shape>> matrices;
  for (int l = 0; l < layers; ++l) {
    for (size_t i = 0; i < layer.size(); ++i) {
      matrices.push_back({absl::StrCat("layers.", l, ".", names[i]), layer[i]});
    }
  }
  return matrices;
}

// The median (the upper one of an even count); `v` must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One JSON line on stdout, flushed.
inline void PrintLine(const nlohmann::ordered_json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_GPU_LLAMA_MATRICES_H_
