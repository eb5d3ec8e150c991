#include "server/worker/cuda_step_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/poll_backoff.h"
#include "common/status.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "lending/cuda_ipc.h"
#include "lending/parameter_progress.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// How long the host waits for the trainer's work to be done before it
// leaves the wait to the device alone.
constexpr auto kHostWaitAtMost = std::chrono::seconds(2);

// Whether this process's contexts on `device` are CUDA MPS clients (false
// where the driver cannot say).
bool UnderMps(int device) {
  int enabled = 0;
  return cudaDeviceGetAttribute(&enabled, cudaDevAttrMpsEnabled, device) ==
             cudaSuccess &&
         enabled != 0;
}

// Returns once the work `event` orders has run, or after kHostWaitAtMost
// (the stream wait that follows then orders it, as it always does),
// polling at common/poll_backoff.h's pace. A step's request arrives once
// the trainer's host has enqueued backward, which its GPU may still be
// running. Where the trainer and the worker time-slice the GPU (no CUDA
// MPS), a stream of this process waiting on the trainer's event meanwhile
// cost that backward dearly: on one H200, 126 ms instead of 73 ms for an
// 8-layer Llama-3-8B-shaped model at 4 K tokens (bench/train_step). So the
// host waits first, and the stream wait it enqueues next is already
// satisfied. Under MPS the two share the GPU's SMs, and the early stream
// wait cost nothing there (the same iteration within 1 ms either way), so
// it is left to the device.
absl::Status AwaitOnHost(IpcEvent& event) {
  const auto give_up = std::chrono::steady_clock::now() + kHostWaitAtMost;
  PollBackoff backoff;
  while (true) {
    MUONPS_ASSIGN_OR_RETURN(const bool done, event.Done());
    if (done || std::chrono::steady_clock::now() >= give_up) {
      return absl::OkStatus();
    }
    backoff.Pause();
  }
}

// The trainer's allocations, mapped by CUDA IPC into this process.
class CudaIpcBuffers final : public TrainerBuffers {
 public:
  explicit CudaIpcBuffers(int device)
      : device_(device), host_waits_(!UnderMps(device)) {
    if (host_waits_) {
      spdlog::info(
          "cuda:{} is not under CUDA MPS: the trainer and this worker "
          "time-slice it, so the step waits for backward to end (the "
          "trainer's per-gradient marks go unused)",
          device);
    }
  }

  // The request's ready event, done counter, progress word and step
  // record, each if it lends it.
  absl::Status OpenSignals(const AttachRequest& request) {
    if (!request.ready_event.empty()) {
      absl::StatusOr<IpcEvent> ready =
          IpcEvent::Open(request.ready_event, device_);
      if (!ready.ok()) return Annotate(ready.status(), "ready_event");
      ready_.emplace(*std::move(ready));
    }
    MUONPS_ASSIGN_OR_RETURN(done_, MapWords(request.done_counter,
                                            sizeof(uint64_t), "done_counter"));
    MUONPS_ASSIGN_OR_RETURN(
        progress_, MapWords(request.parameters_counter, sizeof(uint64_t),
                            "parameters_counter"));
    MUONPS_ASSIGN_OR_RETURN(void* record,
                            MapWords(request.step_record_cuda, kStepRecordBytes,
                                     "step_record.cuda"));
    record_ = static_cast<uint64_t*>(record);
    return absl::OkStatus();
  }

  // `bytes` of 64-bit words the trainer lends at `buffer`, mapped; null
  // when it lends none (an empty handle). INVALID_ARGUMENT naming `field`
  // for an offset that is not a multiple of 8.
  absl::StatusOr<void*> MapWords(const CudaBufferRef& buffer, size_t bytes,
                                 const char* field) {
    if (buffer.ipc_handle.empty()) return nullptr;
    if (buffer.offset < 0 || buffer.offset % sizeof(uint64_t) != 0) {
      return InvalidField(
          absl::StrCat(field, ".offset"),
          absl::StrCat(buffer.offset, " is not a multiple of 8"));
    }
    IpcMemoryRef ref;
    ref.handle = buffer.ipc_handle;
    ref.offset = static_cast<uint64_t>(buffer.offset);
    ref.bytes = bytes;
    ref.device = device_;
    absl::StatusOr<void*> mapped = map_.Open(ref);
    if (!mapped.ok()) return Annotate(mapped.status(), field);
    return *mapped;
  }

  absl::StatusOr<StepRecord> ReadRecord() override {
    if (record_ == nullptr) return absl::NotFoundError("no step record lent");
    uint64_t words[kStepRecordBytes / sizeof(uint64_t)] = {};
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(words, record_, sizeof(words), cudaMemcpyDeviceToHost),
        "reading the trainer's step record"));
    return StepRecordFromWords(words);
  }

  absl::Status WriteRecord(Stream stream, StepRecordWord word,
                           uint64_t value) override {
    if (record_ == nullptr) return absl::OkStatus();
    return StreamWriteValue(stream, record_ + static_cast<int>(word), value);
  }

  absl::Status WaitForTrainer(Stream stream) override {
    if (!ready_.has_value()) return absl::OkStatus();
    if (host_waits_) MUONPS_RETURN_IF_ERROR(AwaitOnHost(*ready_));
    return ready_->MakeStreamWait(stream);
  }

  absl::Status WaitForGradient(int ready, Stream stream) override {
    if (ready < 0) return WaitForTrainer(stream);
    if (host_waits_) {
      MUONPS_RETURN_IF_ERROR(AwaitOnHost(gradient_ready_[ready]));
    }
    return gradient_ready_[ready].MakeStreamWait(stream);
  }

  absl::Status SignalTrainer(Stream stream, int64_t step_id) override {
    MUONPS_RETURN_IF_ERROR(SignalParameters(stream, step_id, kAllMatrices));
    if (done_ == nullptr) return absl::OkStatus();
    return StreamWriteValue(stream, done_, static_cast<uint64_t>(step_id + 1));
  }

  absl::Status SignalParameters(Stream stream, int64_t step_id,
                                uint32_t written) override {
    if (progress_ == nullptr) return absl::OkStatus();
    return StreamWriteValue(stream, progress_,
                            ParameterProgressValue(step_id, written));
  }

  Device device() const override { return {MemoryKind::kCuda, device_}; }

  absl::StatusOr<LentTensor> Map(const TensorBinding& t, int64_t grad_elements,
                                 int64_t param_elements) override {
    const std::string field = absl::StrCat("tensor ", Quoted(t.name));
    LentTensor out;
    MUONPS_ASSIGN_OR_RETURN(out.dtype, LentDType(t));
    const int64_t width = static_cast<int64_t>(DTypeSize(out.dtype));
    for (auto [buffer, elements, pointer, what] :
         {std::tuple<const CudaBufferRef*, int64_t, void**, const char*>{
              &t.grad_cuda, grad_elements, &out.grad, "grad_cuda"},
          {&t.param_cuda, param_elements, &out.param, "param_cuda"}}) {
      // A job matrix may lend no gradient: every step places it
      // (AttachedTrainer::PlaceGradients).
      if (pointer == &out.grad && t.muon && buffer->ipc_handle.empty()) {
        continue;
      }
      if (buffer->ipc_handle.empty() || buffer->offset < 0 ||
          buffer->offset % width != 0 || elements < 1) {
        return InvalidField(absl::StrCat(field, ".", what),
                            absl::StrCat("needs an IPC handle and a ", width,
                                         "-byte aligned offset >= 0"));
      }
      IpcMemoryRef ref;
      ref.handle = buffer->ipc_handle;
      ref.offset = static_cast<uint64_t>(buffer->offset);
      ref.bytes = static_cast<uint64_t>(elements * width);
      ref.device = device_;
      absl::StatusOr<void*> mapped = map_.Open(ref);
      if (!mapped.ok()) {
        return Annotate(mapped.status(), absl::StrCat(field, ".", what));
      }
      *pointer = *mapped;
    }
    if (!t.grad_ready_event.empty()) {
      absl::StatusOr<IpcEvent> ready =
          IpcEvent::Open(t.grad_ready_event, device_);
      if (!ready.ok()) {
        return Annotate(ready.status(),
                        absl::StrCat(field, ".grad_ready_event"));
      }
      // Outside CUDA MPS the gradient is taken at the step's event (out.ready
      // stays -1): work started as backward marks each gradient would run
      // beside the rest of backward, and the two processes' kernels
      // time-slice the GPU. On one H200 (bench/train_step, 8-layer
      // Llama-3-8B-shaped model, 4 K tokens) that made backward 104 ms
      // instead of 72 and the iteration 285 ms instead of 276.
      if (!host_waits_) {
        out.ready = static_cast<int>(gradient_ready_.size());
        gradient_ready_.push_back(*std::move(ready));
      }
    }
    return out;
  }

  absl::StatusOr<std::vector<void*>> MapPlaces(
      const std::vector<GradientPlace>& places,
      const std::vector<int64_t>& bytes) override {
    std::vector<IpcMemoryRef> opened;
    std::vector<void*> out;
    opened.reserve(places.size());
    out.reserve(places.size());
    for (size_t i = 0; i < places.size(); ++i) {
      IpcMemoryRef ref;
      ref.handle = places[i].buffer.ipc_handle;
      ref.offset = static_cast<uint64_t>(places[i].buffer.offset);
      ref.bytes = static_cast<uint64_t>(bytes[i]);
      ref.device = device_;
      absl::StatusOr<void*> mapped =
          places[i].buffer.offset < 0
              ? InvalidField("offset",
                             absl::StrCat(places[i].buffer.offset, " < 0"))
              : map_.Open(ref);
      if (!mapped.ok()) {
        for (const IpcMemoryRef& undo : opened) map_.Close(undo).IgnoreError();
        return Annotate(mapped.status(),
                        absl::StrCat("gradients[", i, "].buffer"));
      }
      opened.push_back(std::move(ref));
      out.push_back(*mapped);
    }
    // Opened again above first, a mapping this step still uses stays open.
    for (const IpcMemoryRef& old : placed_) map_.Close(old).IgnoreError();
    placed_ = std::move(opened);
    return out;
  }

 private:
  const int device_;
  // Outside CUDA MPS: the host waits for the trainer's events before a
  // stream does (AwaitOnHost), and the gradients' own events go unused
  // (Map).
  const bool host_waits_;
  IpcMemoryMap map_;
  // The last MapPlaces call's places, open in map_ until the next one.
  std::vector<IpcMemoryRef> placed_;
  std::optional<IpcEvent> ready_;
  // The gradients' own events (LentTensor::ready indexes them).
  std::vector<IpcEvent> gradient_ready_;
  void* done_ = nullptr;
  void* progress_ = nullptr;    // the parameters' progress word; null: none
  uint64_t* record_ = nullptr;  // the step record; null: none lent
};

// A peer's staging, mapped into this process by CUDA IPC.
class CudaIpcWindow final : public PeerWindow {
 public:
  CudaIpcWindow(IpcMemoryMap map, void* data)
      : map_(std::move(map)), data_(data) {}
  void* data() const override { return data_; }

 private:
  IpcMemoryMap map_;
  void* data_;
};

// Staging in cudaMalloc'd memory (ops_'s), lent by CUDA IPC; peers' opened
// on this worker's device, which copies into them over NVLink or PCIe.
class CudaIpcLender final : public WindowLender {
 public:
  // `ops` outlives the lender (both belong to one backend).
  CudaIpcLender(kernels::DeviceOps* ops, int device)
      : ops_(ops), device_(device) {}

  absl::StatusOr<kernels::TypedBuffer> Allocate(DType dtype, int64_t count,
                                                const char* what,
                                                WindowRecord* record) override {
    *record = WindowRecord{};
    WindowRecord lent = NewWindowRecord(WindowKind::kCudaIpc, dtype, count);
    MUONPS_ASSIGN_OR_RETURN(
        std::unique_ptr<kernels::FloatBuffer> block,
        ops_->Allocate(static_cast<int64_t>(lent.bytes / sizeof(float)), what));
    MUONPS_ASSIGN_OR_RETURN(
        kernels::TypedBuffer buffer,
        kernels::TypedBuffer::Wrap(std::move(block), dtype, count));
    MUONPS_ASSIGN_OR_RETURN(IpcMemoryRef ref,
                            ExportDeviceMemory(buffer.at(0), lent.bytes));
    *record = lent;
    record->device = ref.device;
    record->offset = ref.offset;
    record->bytes = ref.bytes;
    std::memcpy(record->handle, ref.handle.data(),
                std::min(ref.handle.size(), sizeof(record->handle)));
    return buffer;
  }

  absl::Status Signal(Stream stream, uint64_t* word, uint64_t value) override {
    return StreamWriteValue(stream, word, value);
  }

  // On the device, for as long as it takes: the deadline is the host's.
  absl::Status AwaitSignal(Stream stream, const uint64_t* word, uint64_t value,
                           absl::Time /*deadline*/) override {
    return StreamWaitAtLeast(stream, word, value);
  }

  absl::StatusOr<std::unique_ptr<PeerWindow>> Open(
      const WindowRecord& record) override {
    if (record.kind != static_cast<int32_t>(WindowKind::kCudaIpc)) {
      return absl::FailedPreconditionError(
          absl::StrCat("window kind ", record.kind, " is not CUDA IPC"));
    }
    IpcMemoryRef ref;
    ref.handle.assign(record.handle, kCudaIpcHandleBytes);
    ref.offset = record.offset;
    ref.bytes = record.bytes;
    ref.device = device_;  // mapped into this worker's device
    IpcMemoryMap map;
    MUONPS_ASSIGN_OR_RETURN(void* data, map.Open(ref));
    return std::unique_ptr<PeerWindow>(new CudaIpcWindow(std::move(map), data));
  }

 private:
  kernels::DeviceOps* const ops_;
  const int device_;
};

}  // namespace

int CudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

bool CudaDeviceUsable(int device) {
  return device >= 0 && device < CudaDevices();
}

absl::Status DescribeCudaDevice(int device, v1::Device* out) {
  cudaDeviceProp prop{};
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device),
                                    absl::StrCat("cuda:", device)));
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  size_t free_bytes = 0, total_bytes = 0;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  out->set_kind("cuda");
  out->set_name(prop.name);
  out->set_index(device);
  char uuid[64] = {};
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(uuid, sizeof(uuid),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%"
                "02x%02x%02x",
                u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
                u[10], u[11], u[12], u[13], u[14], u[15]);
  out->set_uuid(uuid);
  if (out->memory_bytes() <= 0) {
    out->set_memory_bytes(static_cast<int64_t>(free_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepBackend> CudaStepBackend(const CudaBackendOptions& options) {
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::cuda::CudaDeviceOps> ops,
                          kernels::cuda::CudaDeviceOps::Create(options.device));
  kernels::cuda::CudaKernelsOptions k;
  k.device = options.device;
  k.precision = options.precision;
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::cuda::CudaKernels> kernels,
                          kernels::cuda::CudaKernels::Create(k));
  StepBackend backend;
  backend.kernels = std::move(kernels);
  backend.ops = std::move(ops);
  backend.open_buffers = CudaIpcBuffersOpener(options.device);
  backend.windows =
      std::make_shared<CudaIpcLender>(backend.ops.get(), options.device);
  backend.timeout = options.timeout;
  return backend;
}

TrainerBuffersOpener CudaIpcBuffersOpener(int device) {
  return [device](const AttachRequest& request)
             -> absl::StatusOr<std::unique_ptr<TrainerBuffers>> {
    const std::string mine = absl::StrCat("cuda:", device);
    if (request.device != mine && !(device == 0 && request.device == "cuda")) {
      return InvalidField(
          "device",
          absl::StrCat("the trainer lends ",
                       request.device.empty() ? "cpu" : request.device,
                       " memory; this worker runs on ", mine,
                       " (a trainer lends memory of the worker's GPU)"));
    }
    auto buffers = std::make_unique<CudaIpcBuffers>(device);
    MUONPS_RETURN_IF_ERROR(buffers->OpenSignals(request));
    return std::unique_ptr<TrainerBuffers>(std::move(buffers));
  };
}

}  // namespace worker
}  // namespace muonps
