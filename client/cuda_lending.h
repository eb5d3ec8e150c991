// The CUDA side of a client that lends device memory: exporting a buffer
// for the worker (CUDA IPC), and the events and counter that order the
// trainer's stream and the worker's around a step. Only GPU trainers call
// these; a host-only trainer never touches the CUDA runtime. Thread-safe.
#ifndef MUONPS_CLIENT_CUDA_LENDING_H_
#define MUONPS_CLIENT_CUDA_LENDING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/device.h"
#include "common/dtype.h"
#include "lending/cuda_ipc.h"
#include "muonps/v1/worker.pb.h"

namespace muonps {
namespace client_internal {

// The IPC handle and offset of `elements` values of `dtype` at `data`,
// which must be device memory of `device`. INVALID_ARGUMENT naming `what`
// otherwise.
absl::StatusOr<v1::CudaBuffer> ExportCudaBuffer(const void* data,
                                                int64_t elements, DType dtype,
                                                const Device& device,
                                                const std::string& what);

// `bytes` (at least 1) of zeroed device memory of `device`, from cudaMalloc:
// memory CUDA IPC can always lend, whatever allocator the trainer's
// framework uses (PyTorch's expandable segments and stream-ordered pools
// have no IPC handle). RESOURCE_EXHAUSTED naming `what` when the GPU is
// full. Free it with FreeLendable.
absl::StatusOr<void*> AllocateLendable(const Device& device, int64_t bytes,
                                       const std::string& what);
// Frees what AllocateLendable returned (null: nothing), on whichever device
// holds it; the caller's current device stays as it was.
absl::Status FreeLendable(void* data);

// How a CUDA trainer and its worker order a step without host waits: the
// trainer records `ready` on its stream after the gradients and makes its
// stream wait until the done counter (a word of its device memory) reaches
// step_id + 1, which the worker's stream writes when the step is done or
// refused. A trainer whose forward waits per layer instead makes its
// stream wait, where it reads a layer's parameters, on the parameters'
// progress word beside the counter (lending/parameter_progress.h), which
// the worker's stream advances as the step's updates land. If the worker
// cannot (it died, the RPC failed), Release writes both words from here so
// the trainer's stream never hangs.
//
// Each lent job matrix also has an interprocess event of its own (the
// gradient events, by index), which the trainer records as soon as that
// gradient is final (GradientReady), so that the worker's streams start on
// it while backward still runs. A stream waits for an event's last record
// issued before its wait (IpcEvent), and the worker takes a step's waits
// after the Step call arrives and before it answers. So a step reads each
// gradient event's last record before the Step call, which must come
// after the gradient's last write; and none may be recorded while the
// previous step is unanswered: that record, behind the done counter's wait
// on the trainer's stream, could be taken as the previous step's and never
// complete. BeforeStep records, on the step's stream, every gradient event
// not recorded since the previous step.
//
// Thread-safe: GradientReady may run on any thread (PyTorch runs gradient
// hooks on its autograd thread) while a step is prepared or answered on
// another (an async step's own).
class CudaStepSignals {
 public:
  // Signals for a trainer on `device` with `gradient_events` gradient
  // events (its lent job matrices).
  static absl::StatusOr<std::unique_ptr<CudaStepSignals>> Create(
      const Device& device, int gradient_events);
  ~CudaStepSignals();
  CudaStepSignals(const CudaStepSignals&) = delete;
  CudaStepSignals& operator=(const CudaStepSignals&) = delete;

  // The event, the counter and the step record, for the worker.
  absl::Status Describe(v1::AttachRequest* request) const;
  // The IPC handle of gradient event `index` (TensorBinding's
  // grad_ready_event); the same event on every attach.
  absl::StatusOr<std::string> ExportGradientEvent(int index) const;
  // On `stream`: records gradient event `index`, which then counts as
  // recorded for the next BeforeStep. Returns once enqueued; while a step
  // is unanswered (BeforeStep, then no StepAnswered yet) it first waits
  // for the answer.
  absl::Status GradientReady(int index, Stream stream);
  // On `stream`: records every gradient event not recorded since the last
  // BeforeStep, then ready, then (`wait_for_step`) waits for the done
  // counter. The step is unanswered from here until StepAnswered.
  absl::Status BeforeStep(Stream stream, int64_t step_id, bool wait_for_step);
  // On `stream`: waits until the parameters of the first `written` lent
  // matrices (in the order the attach request binds them) hold step
  // `step_id`'s updates, or that step wrote all it will (kAllMatrices:
  // wrote all; 0: its AdamW means are in the gradients and the worker reads
  // none of them any more). Thread-compatible with BeforeStep.
  // The worker answered the step BeforeStep prepared, or the call failed:
  // GradientReady records again.
  void StepAnswered();
  absl::Status WaitForParameters(Stream stream, int64_t step_id,
                                 uint32_t written);
  // Sets the done counter to step_id + 1 and the progress word to all of
  // the step from the host.
  absl::Status Release(int64_t step_id);

 private:
  CudaStepSignals(const Device& device, IpcEvent ready,
                  std::vector<IpcEvent> gradient_ready)
      : device_(device),
        ready_(std::move(ready)),
        gradient_ready_(std::move(gradient_ready)),
        recorded_(gradient_ready_.size(), false) {}
  bool NoStepUnanswered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !step_unanswered_;
  }
  uint64_t* progress_word() const { return done_ + 1; }

  const Device device_;
  mutable absl::Mutex mu_;
  IpcEvent ready_ ABSL_GUARDED_BY(mu_);
  std::vector<IpcEvent> gradient_ready_ ABSL_GUARDED_BY(mu_);
  // By gradient event: recorded by GradientReady since the last BeforeStep.
  std::vector<bool> recorded_ ABSL_GUARDED_BY(mu_);
  bool step_unanswered_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t* done_ = nullptr;        // device word
  uint64_t* host_value_ = nullptr;  // pinned, 2 words
  CUstream_st* release_stream_ = nullptr;
};

}  // namespace client_internal
}  // namespace muonps

#endif  // MUONPS_CLIENT_CUDA_LENDING_H_
