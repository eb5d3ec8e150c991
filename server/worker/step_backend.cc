#include "server/worker/step_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace muonps {
namespace worker {

absl::StatusOr<EarlyApplyPolicy> EarlyApplyPolicyFromName(
    const std::string& name) {
  if (name == "plan") return EarlyApplyPolicy::kAsPlanned;
  if (name == "always") return EarlyApplyPolicy::kAlways;
  if (name == "never") return EarlyApplyPolicy::kNever;
  return absl::InvalidArgumentError(absl::StrCat(
      "--apply_early: \"", name, "\" is not plan, always or never"));
}

StepBackend CpuStepBackend(absl::Duration timeout, DType update_dtype) {
  StepBackend backend;
  backend.kernels = std::make_unique<kernels::CpuKernels>(
      kernels::CpuKernelOptions{.update_dtype = update_dtype});
  backend.ops = std::make_unique<kernels::CpuDeviceOps>();
  backend.open_buffers = OpenSharedMemoryBuffers;
  backend.windows = SharedMemoryWindowLender();
  backend.timeout = timeout;
  return backend;
}

}  // namespace worker
}  // namespace muonps
