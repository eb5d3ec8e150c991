// A MuonKernels that takes HOST pointers and runs them on the CUDA backend:
// each call copies its inputs into device buffers (kept and reused across
// calls, so the CUDA backend's per-buffer graphs are reused too), runs the
// CudaKernels call on a stream this object owns, copies the results back
// and synchronizes. For tools and tests that hold their data on the host
// (golden_replay); a trainer's worker calls CudaKernels on device memory
// directly.
//
// Host memory: every call takes kHostStream and has finished when it
// returns; another stream is refused with INVALID_ARGUMENT naming `stream`.
// On an error nothing is copied back, so MuonStep and AdamWStep keep their
// "nothing written" contract. Not safe for concurrent use; not copyable.
#ifndef MUONPS_KERNELS_CUDA_HOST_STAGING_KERNELS_H_
#define MUONPS_KERNELS_CUDA_HOST_STAGING_KERNELS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/muon_kernels.h"

namespace muonps {
namespace kernels {
namespace cuda {

class HostStagingKernels final : public MuonKernels {
 public:
  // Creates the CudaKernels it runs on; errors as CudaKernels::Create.
  static absl::StatusOr<std::unique_ptr<HostStagingKernels>> Create(
      const CudaKernelsOptions& options);
  // Waits for and destroys the object's stream.
  ~HostStagingKernels() override;

  absl::string_view backend_name() const override { return "cuda"; }
  DType update_dtype() const override { return device_->update_dtype(); }
  CudaKernels& device_kernels() { return *device_; }

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
  HostStagingKernels(std::unique_ptr<CudaKernels> device, Stream stream)
      : device_(std::move(device)), stream_(stream) {}

  // Device buffer `slot` holding a copy of `count` floats from host `data`
  // (data may be null: just room for `count`).
  absl::StatusOr<float*> Upload(int slot, const float* data, int64_t count);
  // The device twin of a host stack, in buffer `slot`.
  absl::StatusOr<MatrixStack> UploadStack(int slot, const MatrixStack& host,
                                          bool copy = true);
  absl::Status Download(const float* device, float* host, int64_t count);

  std::unique_ptr<CudaKernels> device_;
  Stream stream_;  // owned; every call's device work runs on it
  std::vector<DeviceBuffer> slots_;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_HOST_STAGING_KERNELS_H_
