// The CUDA backend of MuonKernels: cuBLAS GEMMs with bf16, fp16 or fp32
// inputs and fp32 accumulation for Newton-Schulz (NS5 and Gram NS, batched
// over same-shape stacks, one CUDA graph per shape), own fused kernels for
// momentum, normalization, the NS polynomial, the update and AdamW.
//
// Every pointer in MatrixStack, MuonStack and AdamWTensor handed to this
// class is a DEVICE pointer to fp32 data on the object's device. Every call
// runs on the stream it names: a CUDA stream of that device (the legacy
// default stream, kHostStream, is refused with INVALID_ARGUMENT naming
// `stream`); the object owns no stream. UpdateMomentum, Orthogonalize and
// ApplyUpdate only enqueue and return (synchronize the stream before
// reading results on the host); CheckFinite, MuonStep and AdamWStep wait for
// their stream once, at their end, to read the device's finite check and
// return it as a status. MuonStep and AdamWStep never write anything when a
// gradient is not finite: the kernels that write skip on the device's flag.
//
// Calls may name different streams. Newton-Schulz's workspaces, graphs and
// cuBLAS handle are shared by all of them, so a call on a stream other than
// the previous Newton-Schulz call's waits for that call's work first (see
// NsEngine): calls are ordered in call order, never run concurrently; the
// finite-check flag and MuonStep's update buffer are only used by calls
// that end synchronized. Graphs captured on one call replay on any stream.
//
// Not safe for concurrent use (it owns the cuBLAS handle and workspaces);
// create one per thread. Not copyable.
#ifndef MUONPS_KERNELS_CUDA_CUDA_KERNELS_H_
#define MUONPS_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/precision.h"
#include "kernels/muon_kernels.h"

namespace muonps {
namespace kernels {
namespace cuda {

class NsEngine;

struct CudaKernelsOptions {
  int device = 0;
  // GEMM input precision of Newton-Schulz; accumulation is always fp32.
  Precision precision = Precision::kBf16;
  // Per-shape CUDA graph capture of the Newton-Schulz iteration.
  bool use_graphs = true;
  // Symmetric products as lower-triangle tiles whose plan each shape
  // chooses by timing on its first use (the first call of a shape waits for
  // the device once): tiles of 512 rows through cuBLASLt with a searched
  // algorithm (SymmetricMode::kLtTiles) or cuBLAS's tiles of 256 rows,
  // whichever is faster there; false: always cuBLAS's 256-row tiles.
  // Measured on the 56-matrix Llama set in bf16 (ns_gpu_bench, one run
  // each): H200 155.6 ms against 159.3 for cuBLAS's tiles alone, H100 160.0
  // against 168.0.
  bool lt_tiles = true;
};

class CudaKernels : public MuonKernels {
 public:
  // INVALID_ARGUMENT naming `device` for a negative or absent device;
  // UNAVAILABLE when there is no usable CUDA driver or GPU (a machine
  // without a GPU gets this, never a crash); FAILED_PRECONDITION for a GPU
  // older than compute capability 9.0.
  static absl::StatusOr<std::unique_ptr<CudaKernels>> Create(
      const CudaKernelsOptions& options);
  ~CudaKernels() override;

  Precision precision() const { return precision_; }
  // Waits for `stream`; returns any CUDA error (including one raised
  // asynchronously by earlier work) as a status.
  absl::Status Synchronize(Stream stream);

  absl::string_view backend_name() const override { return "cuda"; }
  DType update_dtype() const override;
  absl::Status CheckFinite(const MatrixStack& stack,
                           absl::Span<const std::string> names,
                           Stream stream) override;
  absl::Status UpdateMomentum(const MatrixStack& grad,
                              const MatrixStack& previous,
                              const MatrixStack& momentum, double mu,
                              bool nesterov, const MatrixStack& update,
                              Stream stream) override;
  absl::Status Orthogonalize(const MatrixStack& in, const MatrixStack& out,
                             const NewtonSchulzOptions& options,
                             Stream stream) override;
  absl::Status ApplyUpdate(const MatrixStack& param, const MatrixStack& update,
                           double lr, double weight_decay,
                           LrAdjustment adjustment, Stream stream) override;
  absl::Status MuonStep(const MuonStack& stack,
                        const MuonHyperparameters& hyper,
                        Stream stream) override;
  absl::Status AdamWStep(const AdamWTensor& tensor,
                         const AdamWHyperparameters& hyper, int64_t step,
                         Stream stream) override;

 private:
  explicit CudaKernels(const CudaKernelsOptions& options);
  absl::Status Init(const CudaKernelsOptions& options);
  // Checks that `stream` is a CUDA stream (not null) and makes the object's
  // device current.
  absl::Status Enter(Stream stream) const;
  // Queues the reset of the device's finite-check flag and the check of
  // `count` elements at `data` on `stream`.
  absl::Status QueueFiniteCheck(const float* data, int64_t count,
                                Stream stream);
  // Copies the flag back (waiting for `stream`) and returns the index of
  // the first non-finite element, or -1.
  absl::StatusOr<int64_t> ReadFiniteCheck(Stream stream);
  // "NaN" or "Inf": the value at data[index] (one more synchronous copy,
  // only on the error path).
  absl::StatusOr<std::string> NonFiniteKind(const float* data, int64_t index,
                                            Stream stream);

  int device_;
  Precision precision_;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer first_bad_;                        // one unsigned long long
  unsigned long long* host_first_bad_ = nullptr;  // pinned
  // MuonStep's update in fp32, then (16-bit precision) rounded, grown on
  // demand.
  DeviceBuffer update_;
  std::unique_ptr<NsEngine> engine_;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_CUDA_KERNELS_H_
