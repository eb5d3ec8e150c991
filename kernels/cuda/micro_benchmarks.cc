#include "kernels/cuda/micro_benchmarks.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/lt_gemm.h"
#include "kernels/cuda/ns_elementwise.h"
#include "kernels/cuda/symmetric_gemm.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int64_t kBatch = 16, kM = 4096, kN = 14336;

// Median milliseconds of one call of `op` over `reps` calls after 2 warm-ups.
double TimeMs(cudaStream_t stream, int reps, const std::function<bool()>& op) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  bool ok = true;
  for (int i = -2; i < reps && ok; ++i) {
    cudaEventRecord(start, stream);
    ok = op();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 0) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok || cudaGetLastError() != cudaSuccess) return -1;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void Report(const std::string& what, double ms, double flops, double bytes) {
  std::printf("{\"what\":\"micro\",\"op\":\"%s\",\"ms\":%.4f", what.c_str(),
              ms);
  if (flops > 0) std::printf(",\"tflops\":%.1f", flops / (ms * 1e9));
  if (bytes > 0) std::printf(",\"gbs\":%.0f", bytes / (ms * 1e6));
  std::printf("}\n");
  std::fflush(stdout);
}

struct Gemm {
  const char* name;
  cublasOperation_t ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  cudaDataType ctype;
  float beta;
};

// cuBLASLt: the default (first heuristic) algorithm against the fastest of
// the first 16 heuristics for one strided-batched GEMM.
void LtSearch(cudaStream_t stream, const Gemm& g, const void* a, const void* b,
              void* c, void* workspace, size_t ws_bytes) {
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return;
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta,
                                 sizeof(g.ta));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb,
                                 sizeof(g.tb));
  const auto layout = [&](cudaDataType t, int64_t rows, int64_t cols,
                          int64_t ld) {
    cublasLtMatrixLayout_t l;
    cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld);
    const int32_t batch = kBatch;
    const int64_t stride = rows * cols;
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                     &batch, sizeof(batch));
    cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
        sizeof(stride));
    return l;
  };
  const bool ta = g.ta == CUBLAS_OP_T, tb = g.tb == CUBLAS_OP_T;
  cublasLtMatrixLayout_t la =
      layout(CUDA_R_16BF, ta ? g.k : g.m, ta ? g.m : g.k, g.lda);
  cublasLtMatrixLayout_t lb =
      layout(CUDA_R_16BF, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb);
  cublasLtMatrixLayout_t lc = layout(g.ctype, g.m, g.n, g.ldc);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref,
                                       CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t results[16];
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, results,
                                 &found);
  const double flops = 2.0 * kBatch * g.m * g.n * g.k;
  const float alpha = 1.0f;
  double first = -1, best = 1e30;
  int best_index = -1;
  for (int i = 0; i < found; ++i) {
    const double ms = TimeMs(stream, 5, [&]() {
      return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &g.beta, c, lc, c,
                            lc, &results[i].algo, workspace, ws_bytes,
                            stream) == CUBLAS_STATUS_SUCCESS;
    });
    if (ms <= 0) continue;
    if (i == 0) first = ms;
    if (ms < best) best = ms, best_index = i;
  }
  std::printf(
      "{\"what\":\"micro_lt\",\"op\":\"%s\",\"algos\":%d,\"first_tflops\":"
      "%.1f,\"best_tflops\":%.1f,\"best_index\":%d}\n",
      g.name, found, first > 0 ? flops / (first * 1e9) : 0,
      best_index >= 0 ? flops / (best * 1e9) : 0, best_index);
  std::fflush(stdout);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}

// The lower-triangle tile GEMMs of LowerProduct (16 blocks of 256 rows at
// m = 4096, 16 matrices) for the squares (k = 4096) and X X^T (k = 14336):
// every cuBLASLt candidate of the kLtTiles search and cuBLAS's
// cublasGemmBatchedEx, as JSON lines.
void LtTileSearch(cublasHandle_t handle, const void* x16, const void* sq16,
                  float* c32) {
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return;
  auto ws = DeviceBuffer::Allocate(32 << 20, "lt search workspace");
  const int blocks = 16;
  for (const int64_t k : {kM, kN}) {
    const StackOperand op{k == kM ? sq16 : x16, kM * k, k, true};
    auto tiles = TilePointers::Build(op, op, c32, 2, kBatch, kM, blocks);
    if (!ws.ok() || !tiles.ok()) break;
    const LtGemm::Shape shape =
        TileShape(CUDA_R_16BF, kM, kM / blocks, k, op, op, tiles->tiles());
    auto gemm = LtGemm::Search(lt, handle, shape, tiles->a(), tiles->b(),
                               tiles->c(), ws->get(), ws->bytes(), 32);
    // Lower-triangle FLOPs the tiles compute.
    const double flops = 2.0 * shape.m * shape.n * k * shape.batch;
    if (!gemm.ok()) {
      std::printf("{\"what\":\"lt_tile_search\",\"k\":%lld,\"error\":\"%s\"}\n",
                  static_cast<long long>(k),
                  std::string(gemm.status().message()).c_str());
      continue;
    }
    std::printf(
        "{\"what\":\"lt_tile_search\",\"k\":%lld,\"tiles\":%lld,"
        "\"tile_rows\":%lld,\"cublas_batched_ms\":%.4f,\"cublas_batched_"
        "tflops\":%.1f,\"best_ms\":%.4f,\"best_tflops\":%.1f,\"trials\":[",
        static_cast<long long>(k), static_cast<long long>(shape.batch),
        static_cast<long long>(shape.m), (*gemm)->baseline_ms(),
        flops / ((*gemm)->baseline_ms() * 1e9),
        (*gemm)->trials()[(*gemm)->best()].ms,
        flops / ((*gemm)->trials()[(*gemm)->best()].ms * 1e9));
    for (size_t i = 0; i < (*gemm)->trials().size(); ++i) {
      const LtGemm::Trial& t = (*gemm)->trials()[i];
      std::printf("%s{\"rank\":%d,\"tile\":%d,\"cluster\":%d,\"ms\":%.4f}",
                  i ? "," : "", t.rank, t.tile, t.cluster, t.ms);
    }
    std::printf("]}\n");
    std::fflush(stdout);
  }
  cublasLtDestroy(lt);
}

}  // namespace

bool RunMicroBenchmarks(cublasHandle_t handle, cudaStream_t stream,
                        bool gemms) {
  const int64_t big = kBatch * kM * kN;
  auto f32 = DeviceBuffer::Allocate(big * 4, "micro fp32");
  auto c32 = DeviceBuffer::Allocate(big * 4, "micro out fp32");
  auto a16 = DeviceBuffer::Allocate(big * 2, "micro bf16 a");
  auto b16 = DeviceBuffer::Allocate(big * 2, "micro bf16 b");
  auto ws = DeviceBuffer::Allocate(64 << 20, "micro lt workspace");
  if (!f32.ok() || !c32.ok() || !a16.ok() || !b16.ok() || !ws.ok()) {
    return false;
  }
  {
    std::vector<float> host(kM * kN);
    uint32_t state = 12345;
    for (float& v : host) {
      state = state * 1664525u + 1013904223u;
      v = static_cast<float>(state >> 8) / (1 << 24) - 0.5f;
    }
    for (int64_t i = 0; i < kBatch; ++i) {
      cudaMemcpy(f32->as<float>() + i * kM * kN, host.data(), host.size() * 4,
                 cudaMemcpyHostToDevice);
    }
  }
  LaunchCast(f32->as<float>(), big, a16->get(), CUDA_R_16BF, 1.0f, stream);
  LaunchCast(f32->as<float>(), big, b16->get(), CUDA_R_16BF, 0.5f, stream);
  cudaMemcpyAsync(c32->get(), f32->get(), big * 4, cudaMemcpyDeviceToDevice,
                  stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return false;

  const Gemm gemms_list[] = {
      {"tn_4096^3_bf16out", CUBLAS_OP_T, CUBLAS_OP_N, kM, kM, kM, kM, kM, kM,
       CUDA_R_16BF, 0.0f},
      {"tn_4096^3_fp32out", CUBLAS_OP_T, CUBLAS_OP_N, kM, kM, kM, kM, kM, kM,
       CUDA_R_32F, 0.0f},
      {"nn_4096^3_fp32out_beta", CUBLAS_OP_N, CUBLAS_OP_N, kM, kM, kM, kM, kM,
       kM, CUDA_R_32F, 1.0f},
      {"nn_14336x4096x4096_fp32_beta", CUBLAS_OP_N, CUBLAS_OP_N, kN, kM, kM, kN,
       kM, kN, CUDA_R_32F, 1.0f},
      {"nn_4096x14336x4096_fp32_beta", CUBLAS_OP_N, CUBLAS_OP_N, kM, kN, kM, kM,
       kM, kM, CUDA_R_32F, 1.0f},
      {"tn_4096x4096x14336_fp32", CUBLAS_OP_T, CUBLAS_OP_N, kM, kM, kN, kN, kN,
       kM, CUDA_R_32F, 0.0f},
      {"nt_4096x4096x14336_fp32", CUBLAS_OP_N, CUBLAS_OP_T, kM, kM, kN, kM, kM,
       kM, CUDA_R_32F, 0.0f},
  };
  for (const Gemm& g : gemms_list) {
    if (!gemms) break;
    const float alpha = 1.0f;
    const int64_t sa = g.m * g.k, sb = g.k * g.n, sc = g.m * g.n;
    const double ms = TimeMs(stream, 10, [&]() {
      return cublasGemmStridedBatchedEx(
                 handle, g.ta, g.tb, g.m, g.n, g.k, &alpha, a16->get(),
                 CUDA_R_16BF, g.lda, sa, b16->get(), CUDA_R_16BF, g.ldb, sb,
                 &g.beta, c32->get(), g.ctype, g.ldc, sc, kBatch,
                 CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    });
    Report(g.name, ms, 2.0 * kBatch * g.m * g.n * g.k, 0);
  }
  for (const Gemm& g :
       {gemms_list[1], gemms_list[3], gemms_list[4], gemms_list[5]}) {
    if (!gemms) break;
    LtSearch(stream, g, a16->get(), b16->get(), c32->get(), ws->get(),
             ws->bytes());
  }
  LtTileSearch(handle, a16->get(), b16->get(), c32->as<float>());
  cublasSetStream(handle, stream);
  // Elementwise kernels on 16 x 4096^2 (m x m) and 16 x 4096 x 14336.
  const int64_t sq = kBatch * kM * kM;
  SymmetricCombine combine;
  combine.a = f32->as<float>();
  combine.a2 = f32->as<float>() + sq;
  combine.coef_a2 = 2.0f;
  combine.count = kBatch;
  combine.m = kM;
  combine.low_type = CUDA_R_16BF;
  combine.value_low = a16->get();
  double ms = TimeMs(stream, 10, [&]() {
    return LaunchSymmetricCombine(combine, stream) == cudaSuccess;
  });
  Report("combine_16x4096^2", ms, 0, sq * (4.0 + 2.0));
  combine.a2 = nullptr;
  ms = TimeMs(stream, 10, [&]() {
    return LaunchSymmetricCombine(combine, stream) == cudaSuccess;
  });
  Report("mirror_16x4096^2", ms, 0, sq * (2.0 + 2.0));
  ms = TimeMs(stream, 10, [&]() {
    return LaunchCast(f32->as<float>(), big, a16->get(), CUDA_R_16BF, 1.0f,
                      stream) == cudaSuccess;
  });
  Report("cast_16x4096x14336", ms, 0, big * 6.0);
  auto sums = DeviceBuffer::Allocate(kBatch * sizeof(double), "sums");
  if (!sums.ok()) return false;
  ms = TimeMs(stream, 10, [&]() {
    return LaunchSumOfSquares(f32->as<float>(), kBatch, kM * kN,
                              sums->as<double>(), stream) == cudaSuccess &&
           LaunchNormalize(f32->as<float>(), kBatch, kM * kN,
                           sums->as<double>(), 1.0, 1e-7, c32->as<float>(),
                           a16->get(), CUDA_R_16BF, 1.0f,
                           stream) == cudaSuccess;
  });
  Report("normalize_16x4096x14336", ms, 0, big * (4.0 + 4.0 + 4.0 + 2.0));
  return cudaStreamSynchronize(stream) == cudaSuccess;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
