// The CPU backend of MuonKernels: fp32 throughout, OpenBLAS underneath.
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
};

class CpuKernels final : public MuonKernels {
 public:
  explicit CpuKernels(const CpuKernelOptions& options = {});

  absl::string_view backend_name() const override { return "cpu"; }
  // Newton-Schulz runs in fp32 on the host.
  DType update_dtype() const override { return DType::kFloat32; }
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
  cpu::NsWorkspace workspace_;
  std::vector<float> update_;
};

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CPU_CPU_KERNELS_H_
