// Shared by the GPU data-path tests (tests/gpu_step_test.cc,
// tests/gpu_two_workers_test.cc): the matrix set every case lends,
// deterministic gradients, copies to and from lent buffers of either
// dtype, and the relative error they are judged by.
#ifndef MUONPS_TESTS_GPU_TEST_SUPPORT_H_
#define MUONPS_TESTS_GPU_TEST_SUPPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/device.h"
#include "common/dtype.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"

namespace muonps {
namespace testing {

inline constexpr absl::Duration kGpuStartTimeout = absl::Seconds(60);

struct MatrixCase {
  std::string name;
  int64_t rows, cols, experts;
};

// Two same-shape matrices (one stack on the owner), a wide, a tall and a
// square one, and a 3-expert stack.
const std::vector<MatrixCase>& Matrices();

// A deterministic gradient value, of varied magnitude and sign.
float GradValue(int64_t step, int matrix, int64_t i);

// `values` rounded to `dtype` (fp32 or bf16), copied to device memory at
// `device`; and `count` values of `dtype` at `device`, widened to float.
// INTERNAL with the CUDA error otherwise.
absl::Status UploadAs(DType dtype, const std::vector<float>& values,
                      void* device);
absl::StatusOr<std::vector<float>> DownloadAs(DType dtype, const void* device,
                                              int64_t count);

// The single-process reference of one step of `grad`/`momentum` (fp32
// device stacks; `grad` is overwritten) applied to the parameter at
// `param`, of `dtype`, on `stream` (synchronized before returning): fp32
// parameters through MuonStep; bf16 ones through momentum, Newton-Schulz
// and the worker's own DeviceOps::ApplyScaled (fp32 arithmetic, one
// rounding), as the worker does.
absl::Status ReferenceStep(kernels::MuonKernels& kernels,
                           kernels::DeviceOps& ops,
                           const kernels::MatrixStack& grad,
                           const kernels::MatrixStack& momentum, void* param,
                           DType dtype, const kernels::MuonHyperparameters& h,
                           Stream stream);

// ||a - b||_F / ||b||_F in double.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_GPU_TEST_SUPPORT_H_
