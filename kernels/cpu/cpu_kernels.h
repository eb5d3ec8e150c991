// The CPU backend of MuonKernels: fp32 throughout, OpenBLAS underneath; the
// update may be rounded to a 16-bit precision (CpuKernelOptions).
// Works on host memory: every call takes kHostStream and has finished when
// it returns; any other stream is refused with INVALID_ARGUMENT naming
// `stream`, before anything is read or written.
//
// Not safe for concurrent use (it owns scratch buffers); create one per
// thread. Construction sets OpenBLAS's thread count, which is process-wide.
#ifndef MUONPS_KERNELS_CPU_CPU_KERNELS_H_
#define MUONPS_KERNELS_CPU_CPU_KERNELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/newton_schulz.h"
#include "kernels/muon_kernels.h"

namespace muonps {
namespace kernels {

struct CpuKernelOptions {
  // OpenBLAS threads; 0 keeps OpenBLAS's default (all cores).
  int threads = 0;
  // Newton-Schulz iterates in fp32 here; a 16-bit type rounds its result to
  // it, as a GPU iterating in that precision does (update_dtype).
  DType update_dtype = DType::kFloat32;
};

class CpuKernels final : public MuonKernels {
 public:
  explicit CpuKernels(const CpuKernelOptions& options = {});

  absl::string_view backend_name() const override { return "cpu"; }
  DType update_dtype() const override { return update_dtype_; }
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
  const DType update_dtype_;
  cpu::NsWorkspace workspace_;
  std::vector<float> update_;
  std::vector<uint16_t> rounded_;
};

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CPU_CPU_KERNELS_H_
