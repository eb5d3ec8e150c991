// What a trainer lends its worker when it attaches, as the worker's core
// reads it: the domain form of muonps.v1.AttachRequest, converted once at
// the service edge (server/worker/wire.h). Plain values; thread-compatible.
#ifndef MUONPS_SERVER_WORKER_ATTACH_REQUEST_H_
#define MUONPS_SERVER_WORKER_ATTACH_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace worker {

// The most parameter groups a trainer may attach tensors in.
constexpr int kMaxParamGroups = 1024;

// A buffer inside a CUDA allocation of the trainer, lent by CUDA IPC.
struct CudaBufferRef {
  std::string ipc_handle;  // cudaIpcGetMemHandle of the allocation (64 bytes)
  int64_t offset = 0;      // of the buffer in the allocation, in bytes
};

// One lent tensor: a job matrix (Muon, stepped by the workers) or any other
// tensor (AdamW, stepped by the trainer's client).
struct TensorBinding {
  std::string name;
  bool muon = false;
  // Elements of the gradient (a row_sharded matrix: this rank's rows) and
  // of the parameter (0: as many as the gradient).
  int64_t elements = 0;
  int64_t param_elements = 0;
  DType dtype = DType::kFloat32;  // of both buffers
  // AdamW tensors: kUnreduced (the workers average the gradient over the
  // trainers) or kReplicated. Unused for job matrices (the job's layout).
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  // Shared-memory lending: byte offsets in the segment.
  int64_t grad_offset = 0;
  int64_t param_offset = 0;
  // CUDA IPC lending.
  CudaBufferRef grad_cuda;
  CudaBufferRef param_cuda;
  // CUDA job matrices: the interprocess event the trainer records once this
  // gradient is final (empty: none; the request's ready_event orders it).
  std::string grad_ready_event;
  // Index of the tensor's parameter group in every StepRequest::groups;
  // -1: in no group (the step's own values apply).
  int group = -1;
};

struct AttachRequest {
  int trainer_rank = 0;
  int trainer_count = 1;
  // A POSIX shared-memory segment ("" for CUDA lending) and its size.
  std::string segment;
  int64_t segment_bytes = 0;
  std::vector<TensorBinding> tensors;
  // "" or "cpu": the segment; "cuda:N": CUDA IPC buffers on device N.
  std::string device;
  // CUDA trainers: the interprocess event recorded after the gradients
  // (empty: none), and the 64-bit done counter the worker's stream sets to
  // step_id + 1 (empty handle: none).
  std::string ready_event;
  CudaBufferRef done_counter;
  // CUDA trainers: the word the worker's stream advances as a step's
  // updates land (lending/parameter_progress.h; empty handle: none).
  CudaBufferRef parameters_counter;
  int64_t trainer_pid = 0;  // 0: not checked
  // Where the trainer lends its step record (lending/step_record.h): a
  // byte offset in the segment, or CUDA memory; -1 and an empty handle:
  // none is lent.
  int64_t step_record_offset = -1;
  CudaBufferRef step_record_cuda;
};

struct AttachResponse {
  int64_t plan_version = 0;
  int rank = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_ATTACH_REQUEST_H_
