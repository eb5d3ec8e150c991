// TrainerBuffers: the gradient and parameter buffers a trainer lends to its
// worker, as the worker maps them. One interface for the two ways to lend:
// a POSIX shared-memory segment (host memory, the CPU path) and CUDA IPC
// (device memory of the trainer's GPU; cuda_trainer_buffers.h).
//
// Ownership: the object owns the mappings and releases them (munmap,
// cudaIpcCloseMemHandle) when destroyed; the trainer keeps the memory
// alive while attached. Thread-compatible.
#ifndef MUONPS_SERVER_WORKER_TRAINER_BUFFERS_H_
#define MUONPS_SERVER_WORKER_TRAINER_BUFFERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/dtype.h"
#include "lending/step_record.h"
#include "server/worker/attach_request.h"
#include "server/worker/step_request.h"

namespace muonps {
namespace worker {

// One lent tensor: `grad_elements` and `param_elements` values of `dtype`
// (fp32 or bf16) each.
struct LentTensor {
  void* grad = nullptr;
  void* param = nullptr;
  DType dtype = DType::kFloat32;
  // The event the trainer records once this gradient is final (CUDA job
  // matrices that lend one: an index for WaitForGradient); -1: none.
  int ready = -1;
};

// The element type a binding lends; INVALID_ARGUMENT naming the tensor
// unless fp32 or bf16.
absl::StatusOr<DType> LentDType(const TensorBinding& binding);

class TrainerBuffers {
 public:
  TrainerBuffers() = default;
  TrainerBuffers(const TrainerBuffers&) = delete;
  TrainerBuffers& operator=(const TrainerBuffers&) = delete;
  virtual ~TrainerBuffers() = default;

  // Where the lent memory lives.
  virtual Device device() const = 0;

  // The buffers of `binding`, holding `grad_elements` and `param_elements`
  // elements of LentDType(binding). INVALID_ARGUMENT naming the tensor when
  // they do not fit the lent memory, are misaligned, or are neither fp32
  // nor bf16.
  virtual absl::StatusOr<LentTensor> Map(const TensorBinding& binding,
                                         int64_t grad_elements,
                                         int64_t param_elements) = 0;

  // OK while the lent memory is intact; FAILED_PRECONDITION naming it once
  // it is not (a truncated shared-memory segment, whose lost pages would
  // raise SIGBUS). Checked before every step reads it.
  virtual absl::Status CheckIntact() const { return absl::OkStatus(); }

  // Makes `stream` wait until the trainer's gradients of the step are
  // written (CUDA: its ready event; without CUDA MPS the host waits for it
  // first, for up to 2 s, so no stream of the worker's waits on the
  // trainer's work while that runs). Host memory: nothing to wait for (the
  // trainer wrote them before its Step call).
  virtual absl::Status WaitForTrainer(Stream /*stream*/) {
    return absl::OkStatus();
  }
  // Makes `stream` wait until the gradient whose LentTensor::ready is
  // `ready` is final (CUDA: the event the trainer records for it as
  // backward produces it, before its Step call; without MPS waited for on
  // the host first, as above); -1: WaitForTrainer.
  virtual absl::Status WaitForGradient(int ready, Stream stream) {
    return ready < 0 ? WaitForTrainer(stream) : absl::OkStatus();
  }
  // Tells the trainer, in `stream` order, that step `step_id` is done
  // (CUDA: its parameters' progress word says every matrix, then its done
  // counter becomes step_id + 1). Host memory: the Step response says it.
  virtual absl::Status SignalTrainer(Stream /*stream*/, int64_t /*step_id*/) {
    return absl::OkStatus();
  }
  // Tells the trainer, in `stream` order, that the parameters of the first
  // `written` job matrices it bound (in its attach request's order) hold
  // step `step_id`'s updates, 0: its AdamW means are written
  // (lending/parameter_progress.h; CUDA trainers that lent the word). OK
  // without writing otherwise.
  virtual absl::Status SignalParameters(Stream /*stream*/, int64_t /*step_id*/,
                                        uint32_t /*written*/) {
    return absl::OkStatus();
  }

  // Where this step's gradients lie instead of their lent buffers
  // (StepRequest::gradients; a CUDA trainer hands over the gradients
  // backward allocated): `places[i]`, `bytes[i]` bytes of it, mapped into
  // this process. The mappings of the previous call that this one does not
  // reuse are released, so memory the trainer's allocator frees stays open
  // here until the next step at most. INVALID_ARGUMENT naming
  // `gradients[i]` for a place that cannot be mapped (nothing changes
  // then). Host memory: none may be given (a host trainer's gradients stay
  // in its segment).
  virtual absl::StatusOr<std::vector<void*>> MapPlaces(
      const std::vector<GradientPlace>& places,
      const std::vector<int64_t>& bytes);

  // The trainer's step record (lending/step_record.h), read now (after
  // what the stream did so far); NOT_FOUND when the trainer lent none.
  virtual absl::StatusOr<StepRecord> ReadRecord() {
    return absl::NotFoundError("no step record lent");
  }
  // Sets word `word` of the record to `value` in `stream` order (after the
  // work enqueued on it so far); OK without writing when none was lent.
  virtual absl::Status WriteRecord(Stream /*stream*/, StepRecordWord /*word*/,
                                   uint64_t /*value*/) {
    return absl::OkStatus();
  }
};

// Opens what an AttachRequest lends (the worker's choice per device).
using TrainerBuffersOpener =
    std::function<absl::StatusOr<std::unique_ptr<TrainerBuffers>>(
        const AttachRequest& request)>;

// The request's shared-memory segment. INVALID_ARGUMENT naming `segment`
// when the request lends CUDA memory instead; NOT_FOUND or
// FAILED_PRECONDITION (size) from opening the segment.
absl::StatusOr<std::unique_ptr<TrainerBuffers>> OpenSharedMemoryBuffers(
    const AttachRequest& request);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_TRAINER_BUFFERS_H_
