#include "client/cuda_lending.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_device.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "lending/cuda_ipc.h"
#include "lending/parameter_progress.h"
#include "lending/step_record.h"

namespace muonps {
namespace client_internal {

absl::StatusOr<v1::CudaBuffer> ExportCudaBuffer(const void* data,
                                                int64_t elements, DType dtype,
                                                const Device& device,
                                                const std::string& what) {
  if (data == nullptr || elements < 1) {
    return InvalidField(what, "needs a device buffer of at least 1 element");
  }
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess ||
      attributes.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return InvalidField(what, "is not CUDA device memory");
  }
  if (attributes.device != device.ordinal) {
    return InvalidField(
        what, absl::StrCat("is memory of cuda:", attributes.device, ", not of ",
                           DeviceName(device)));
  }
  absl::StatusOr<IpcMemoryRef> ref = ExportDeviceMemory(
      data, static_cast<uint64_t>(elements) * DTypeSize(dtype));
  if (!ref.ok()) return Annotate(ref.status(), what);
  v1::CudaBuffer out;
  out.set_ipc_handle(ref->handle);
  out.set_offset(static_cast<int64_t>(ref->offset));
  return out;
}

absl::StatusOr<void*> AllocateLendable(const Device& device, int64_t bytes,
                                       const std::string& what) {
  if (bytes < 1) return InvalidField(what, "needs at least 1 byte");
  return OnDevice(device.ordinal, [&]() -> absl::StatusOr<void*> {
    void* data = nullptr;
    // Out of memory is RESOURCE_EXHAUSTED (CudaStatus), naming `what`.
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&data, static_cast<size_t>(bytes)),
                   absl::StrCat("cudaMalloc(", what, ")")));
    // Synchronous: the memory is zeros before the caller hands it anywhere.
    const absl::Status zeroed = CudaStatus(
        cudaMemset(data, 0, static_cast<size_t>(bytes)), "cudaMemset");
    if (!zeroed.ok()) {
      (void)cudaFree(data);
      return zeroed;
    }
    return data;
  });
}

absl::Status FreeLendable(void* data) {
  if (data == nullptr) return absl::OkStatus();
  cudaPointerAttributes attributes{};
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, data),
                                    "cudaPointerGetAttributes"));
  return OnDevice(attributes.device,
                  [data] { return CudaStatus(cudaFree(data), "cudaFree"); });
}

namespace {
// Where the parameters' progress word and the step record sit in the done
// counter's allocation.
constexpr size_t kProgressOffset = sizeof(uint64_t);
constexpr size_t kStepRecordOffset = 64;
static_assert(kStepRecordOffset + kStepRecordBytes <= 256);
}  // namespace

absl::StatusOr<std::unique_ptr<CudaStepSignals>> CudaStepSignals::Create(
    const Device& device, int gradient_events) {
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device.ordinal), "cudaSetDevice"));
  MUONPS_ASSIGN_OR_RETURN(IpcEvent ready, IpcEvent::Create(device.ordinal));
  std::vector<IpcEvent> gradient_ready;
  gradient_ready.reserve(gradient_events);
  for (int i = 0; i < gradient_events; ++i) {
    MUONPS_ASSIGN_OR_RETURN(IpcEvent event, IpcEvent::Create(device.ordinal));
    gradient_ready.push_back(std::move(event));
  }
  std::unique_ptr<CudaStepSignals> out(
      new CudaStepSignals(device, std::move(ready), std::move(gradient_ready)));
  // 256 bytes: an allocation of its own, so its IPC handle lends nothing
  // else. The done counter, the parameters' progress word, then at 64
  // bytes the step record (lending/step_record.h), zero-filled: no worker
  // wrote them yet.
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&out->done_), 256),
                 "cudaMalloc done counter"));
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemset(out->done_, 0, 256), "cudaMemset"));
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMallocHost(reinterpret_cast<void**>(&out->host_value_),
                                2 * sizeof(uint64_t)),
                 "cudaMallocHost"));
  cudaStream_t stream = nullptr;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  out->release_stream_ = stream;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  return out;
}

CudaStepSignals::~CudaStepSignals() {
  cudaSetDevice(device_.ordinal);
  if (release_stream_ != nullptr) cudaStreamDestroy(release_stream_);
  if (host_value_ != nullptr) cudaFreeHost(host_value_);
  if (done_ != nullptr) cudaFree(done_);
}

absl::Status CudaStepSignals::Describe(v1::AttachRequest* request) const {
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(*request->mutable_ready_event(), ready_.Export());
  }
  MUONPS_ASSIGN_OR_RETURN(IpcMemoryRef ref,
                          ExportDeviceMemory(done_, sizeof(uint64_t)));
  request->mutable_done_counter()->set_ipc_handle(ref.handle);
  request->mutable_done_counter()->set_offset(static_cast<int64_t>(ref.offset));
  MUONPS_ASSIGN_OR_RETURN(
      IpcMemoryRef progress,
      ExportDeviceMemory(progress_word(), sizeof(uint64_t)));
  request->mutable_parameters_counter()->set_ipc_handle(progress.handle);
  request->mutable_parameters_counter()->set_offset(
      static_cast<int64_t>(progress.offset));
  MUONPS_ASSIGN_OR_RETURN(
      IpcMemoryRef record,
      ExportDeviceMemory(reinterpret_cast<char*>(done_) + kStepRecordOffset,
                         kStepRecordBytes));
  request->mutable_step_record()->mutable_cuda()->set_ipc_handle(record.handle);
  request->mutable_step_record()->mutable_cuda()->set_offset(
      static_cast<int64_t>(record.offset));
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaStepSignals::ExportGradientEvent(
    int index) const {
  absl::MutexLock lock(&mu_);
  return gradient_ready_[index].Export();
}

absl::Status CudaStepSignals::GradientReady(int index, Stream stream) {
  // Held while recording: a BeforeStep on another thread then sees the
  // record, or records after it.
  absl::MutexLock lock(
      &mu_, absl::Condition(this, &CudaStepSignals::NoStepUnanswered));
  MUONPS_RETURN_IF_ERROR(gradient_ready_[index].Record(stream));
  recorded_[index] = true;
  return absl::OkStatus();
}

absl::Status CudaStepSignals::BeforeStep(Stream stream, int64_t step_id,
                                         bool wait_for_step) {
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device_.ordinal), "cudaSetDevice"));
  absl::MutexLock lock(&mu_);
  // The gradients the trainer did not say were final: ordered by this
  // stream, as the step's own event orders them.
  for (size_t i = 0; i < gradient_ready_.size(); ++i) {
    if (!recorded_[i]) {
      MUONPS_RETURN_IF_ERROR(gradient_ready_[i].Record(stream));
    }
  }
  MUONPS_RETURN_IF_ERROR(ready_.Record(stream));
  if (wait_for_step) {
    MUONPS_RETURN_IF_ERROR(
        StreamWaitAtLeast(stream, done_, static_cast<uint64_t>(step_id + 1)));
  }
  recorded_.assign(recorded_.size(), false);
  step_unanswered_ = true;
  return absl::OkStatus();
}

void CudaStepSignals::StepAnswered() {
  absl::MutexLock lock(&mu_);
  step_unanswered_ = false;
}

absl::Status CudaStepSignals::WaitForParameters(Stream stream, int64_t step_id,
                                                uint32_t written) {
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device_.ordinal), "cudaSetDevice"));
  return StreamWaitAtLeast(stream, progress_word(),
                           ParameterProgressValue(step_id, written));
}

absl::Status CudaStepSignals::Release(int64_t step_id) {
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device_.ordinal), "cudaSetDevice"));
  // The done counter and the progress word, adjacent: one copy.
  static_assert(kProgressOffset == sizeof(uint64_t));
  host_value_[0] = static_cast<uint64_t>(step_id + 1);
  host_value_[1] = ParameterProgressValue(step_id, kAllMatrices);
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(done_, host_value_, 2 * sizeof(uint64_t),
                                 cudaMemcpyHostToDevice, release_stream_),
                 "releasing the trainer's stream"));
  return CudaStatus(cudaStreamSynchronize(release_stream_),
                    "releasing the trainer's stream");
}

}  // namespace client_internal
}  // namespace muonps
