// Shared by the GPU data-path tests (tests/gpu_step_test.cc,
// tests/gpu_two_workers_test.cc, tests/gpu_two_gpus_test.cc): the matrix
// set every case lends, deterministic gradients, copies to and from lent
// buffers of either dtype, the single-process reference (one step, and
// every matrix over many steps), and the relative error they are judged
// by. Errors are returned as absl::Status, never asserted; device memory
// is freed on every path. Test-only; thread-compatible.
#ifndef MUONPS_TESTS_GPU_TEST_SUPPORT_H_
#define MUONPS_TESTS_GPU_TEST_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
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

// The environment (for ChildProcess::Start) of a process that joins NCCL
// from a GPU another rank also uses: NCCL refuses two ranks of one host on
// one GPU (its duplicate-GPU check compares host hash and bus id), so the
// process names a host of its own (`name` and this process's pid), and
// NCCL joins it to the others over its network transport on loopback (the
// device machine reaches nothing else).
std::vector<std::string> OwnNcclHostEnvironment(const std::string& name);

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
// `device` and landed there (a pageable copy may return before its DMA
// does, and a worker reads them behind an event of another stream); and
// `count` values of `dtype` at `device`, widened to float. INTERNAL with
// the CUDA error otherwise.
absl::Status UploadAs(DType dtype, const std::vector<float>& values,
                      void* device);
absl::StatusOr<std::vector<float>> DownloadAs(DType dtype, const void* device,
                                              int64_t count);

// The single-process reference of one step of `grad`/`momentum` (fp32
// device stacks; `grad` is overwritten) applied to the parameter at
// `param`, of `dtype`, on `stream` (synchronized before returning): fp32
// parameters through MuonStep; bf16 ones through momentum, Newton-Schulz,
// the result rounded to the kernels' update_dtype and the worker's own
// DeviceOps::ApplyScaled (fp32 arithmetic, one rounding), as the worker
// does.
absl::Status ReferenceStep(kernels::MuonKernels& kernels,
                           kernels::DeviceOps& ops,
                           const kernels::MatrixStack& grad,
                           const kernels::MatrixStack& momentum, void* param,
                           DType dtype, const kernels::MuonHyperparameters& h,
                           Stream stream);

// `v` as a lent buffer of `dtype` holds it: unchanged for fp32, rounded
// through bf16 otherwise.
float AsLent(DType dtype, float v);

// The parameters (every expert of each matrix of Matrices(), widened to
// float, in Matrices() order) that the same kernels reach in this process
// on cuda:0 after `steps` steps of lr 0.02 and weight decay 0.1 (other
// hyperparameters at their defaults) from initial(m, i), on the gradients
// grad(step, m, i) (fp32, already as lent), with each matrix's NS
// algorithm from `algorithms` (by matrix name); params of `dtype`. Each
// matrix runs ReferenceStep once per step, in step order, on a blocking
// stream the call creates (and destroys). `i` is the whole-stack index
// (expert-major). NOT_FOUND for a matrix `algorithms` lacks; the kernels'
// errors (UNAVAILABLE without a GPU) or INTERNAL with the CUDA error otherwise,
// naming the matrix and step.
absl::StatusOr<std::vector<std::vector<float>>> ReferenceParams(
    DType dtype, int steps,
    const std::map<std::string, NsAlgorithm>& algorithms,
    const std::function<float(size_t m, int64_t i)>& initial,
    const std::function<float(int64_t step, size_t m, int64_t i)>& grad);

// Rows [b, e) of every expert of `full` (a whole stack of `c`, expert-major),
// one expert after another: what a trainer holding those rows lends.
std::vector<float> ExpertRows(const std::vector<float>& full,
                              const MatrixCase& c, int64_t b, int64_t e);

// ||a - b||_F / ||b||_F in double.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_GPU_TEST_SUPPORT_H_
