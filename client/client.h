// muonps::Client: a trainer rank's handle on muonps. It declares the
// model's matrices (optimized by Muon on the workers) and its other tensors
// (stepped here with AdamW), lends their gradient and parameter buffers to
// the local worker, and triggers steps. Host trainers lend one POSIX
// shared-memory segment the client creates (Buffers() places the model in
// it); GPU trainers (options.device cuda:N) lend their own CUDA buffers by
// CUDA IPC (LendCuda), and the worker on the same GPU updates their
// parameters in place.
//
// Lifecycle: Create, AddMatrix/AddTensor for every tensor (identical on all
// ranks), Start (creates the job if needed, waits for the local worker's
// plan, attaches), then Buffers() to place the model in the lent memory,
// and Step() once per optimizer step after writing the gradients. Errors
// are absl::Status values naming the tensor or field. Not thread-safe: one
// trainer thread uses a Client.
#ifndef MUONPS_CLIENT_CLIENT_H_
#define MUONPS_CLIENT_CLIENT_H_

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cuda_lending.h"
#include "common/device.h"
#include "kernels/cpu/cpu_kernels.h"
#include "lending/shared_memory.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "proto/credentials.h"
#include "scheduler/plan_types.h"

namespace muonps {

struct ClientOptions {
  std::string coordinator;    // "host:port"
  std::string job;            // created by the first rank to Start
  std::string worker_socket;  // the local worker's Unix socket path
  int trainer_rank = 0;
  int trainer_count = 1;
  // How long Start waits for the worker's plan, and a step for its peers.
  absl::Duration timeout = absl::Seconds(60);
  // Where the trainer's buffers live: the host (a shared segment), or a
  // CUDA device (buffers lent with LendCuda; the local worker must run on
  // that same GPU).
  Device device = kHostDevice;
  // Credential files (proto/credentials.h): the bearer token the
  // coordinator and the worker check, the CA of the coordinator's TLS
  // certificate, a client certificate for mutual TLS. Empty fields come
  // from MUONPS_TOKEN_FILE, MUONPS_TLS_CA_FILE, MUONPS_TLS_CERT_FILE and
  // MUONPS_TLS_KEY_FILE.
  SecurityConfig security;
};

struct MatrixOptions {
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  int32_t layer = 0;
  int64_t experts = 1;  // > 1: a 3-D stack of expert matrices
  // row_sharded only: the parameter is sharded like the gradient (FSDP,
  // updates scattered), or false: the trainer keeps the whole parameter
  // (sharded gradients only; the full update is broadcast).
  bool shard_params = true;
};

// A tensor's lent buffers. For a row_sharded matrix the gradient holds this
// rank's rows only: [row_begin, row_end) of every expert, expert-major; so
// does the parameter unless shard_params is false.
struct TensorBuffers {
  // Of `dtype`: fp32 in the shared segment; a CUDA trainer's lent buffers
  // are of the dtype it lent them with (cast a bf16 one before use).
  float* param = nullptr;
  float* grad = nullptr;
  DType dtype = DType::kFloat32;
  int64_t elements = 0;        // of grad
  int64_t param_elements = 0;  // of param
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

struct ParamGroupOptions {
  std::vector<std::string> matrices;
  double lr = 0;
  double weight_decay = 0;
};

struct StepOptions {
  // CUDA trainers: the stream the gradients were produced on (kHostStream:
  // the legacy default stream). The worker's stream waits for it, and it
  // waits for the worker's updates, on the device: no host waits.
  Stream stream = kHostStream;
  // CUDA trainers: return once the step is enqueued (the trainer's stream
  // sees the updated parameters when it gets there); Wait() returns the
  // step's result, and the next Step waits for it first.
  bool async = false;
  // Muon lr and weight decay for this step; < 0 keeps the job's defaults.
  double lr = -1;
  double weight_decay = -1;
  std::vector<ParamGroupOptions> groups;
  // AdamW lr for this step; < 0 keeps Start's.
  double adamw_lr = -1;
};

struct StepResult {
  // Step(..., {.async = true}) returned before the step finished.
  bool pending = false;
  // The workers had committed this step id before (an earlier call whose
  // answer was lost, or a retry that settled it).
  bool already_applied = false;
  // This call stepped the AdamW tensors (host trainers): the first answer
  // that the step id is committed, fresh or already applied. Once per
  // committed step id.
  bool adamw_applied = false;
  double seconds = 0;
  int64_t bytes_moved = 0;
  int64_t momentum_reset = 0;
  int64_t plan_version = 0;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Declares a Muon matrix (before Start). INVALID_ARGUMENT naming the
  // field for bad shapes (a dimension below 1 or above kMaxDimension, more
  // than kMaxTensorElements in all) or a duplicate name.
  absl::Status AddMatrix(const std::string& name, int64_t rows, int64_t cols,
                         const MatrixOptions& options = {});
  // The largest dimension and element count a tensor may declare: far
  // above any model's, low enough that sizes, offsets and row ranges
  // computed from them never overflow.
  static constexpr int64_t kMaxDimension = (int64_t{1} << 31) - 1;
  static constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

  // Declares a tensor stepped here with AdamW (before Start); `layout` is
  // kUnreduced (gradients averaged over trainers by the workers) or
  // kReplicated.
  absl::Status AddTensor(const std::string& name, int64_t elements,
                         scheduler::Layout layout);

  // CUDA trainers: lends a declared matrix's (or unreduced AdamW tensor's,
  // whose gradient the workers then average in place) gradient and
  // parameter, device memory of options.device holding Buffers()' element
  // counts of `dtype` (fp32 or bf16: the worker keeps fp32 momentum, widens
  // bf16 gradients and rounds each updated parameter once). The trainer
  // keeps them allocated and in place while attached; sub-blocks of larger
  // allocations (PyTorch's caching allocator) are fine. Before Start;
  // INVALID_ARGUMENT naming the matrix for host memory, another device's,
  // a dtype other than fp32 and bf16, or a matrix lent twice.
  absl::Status LendCuda(const std::string& name, void* grad, void* param,
                        DType dtype = DType::kFloat32);

  // Before Start: the job expects `count` workers with no trainer
  // (muonps-worker --dedicated, JobSpec.dedicated_workers), and Start waits
  // for a plan that has them. The same on every rank; INVALID_ARGUMENT
  // naming `dedicated_workers` outside 0..1024.
  absl::Status ExpectDedicatedWorkers(int count);

  // Before Start: whether the job lets a matrix whose owner left (and whose
  // momentum no checkpoint holds) start again from zero momentum
  // (JobSpec.allow_momentum_reset; StepResult.momentum_reset counts them).
  // False (the default): such a step fails with FAILED_PRECONDITION naming
  // the matrix. The same on every rank. FAILED_PRECONDITION after Start.
  absl::Status AllowMomentumReset(bool allow);
  // Before Start: the job's workers checkpoint the momentum they own into
  // `dir` (absolute; JobSpec.checkpoint_dir) after every step whose id is
  // a multiple of `every` (0: only when RequestCheckpoint asks), and
  // restore momentum they lack from there. The same on every rank.
  // INVALID_ARGUMENT naming the field for a relative dir or every < 0.
  absl::Status SetCheckpointing(const std::string& dir, int64_t every);
  // Asks the local worker for a checkpoint after the next step it commits.
  // Returns the last step it checkpointed (-1: none); FAILED_PRECONDITION
  // when the job has no checkpoint_dir.
  absl::StatusOr<int64_t> RequestCheckpoint();
  // The last step the local worker checkpointed durably (-1: none), from
  // its status.
  absl::StatusOr<int64_t> LastCheckpointStep() const;
  // Makes the local worker replace the momentum of every expert it owns
  // with checkpoint `step` of `dir` (all or nothing); returns how many it
  // restored. NOT_FOUND naming an owned expert the checkpoint lacks.
  absl::StatusOr<int64_t> RestoreCheckpoint(const std::string& dir,
                                            int64_t step);

  // Creates the segment (host trainers) and the job (a job of the same name
  // must have the same matrices), waits for the local worker to follow a plan,
  // attaches. `ns_algorithm` forces NS5 or Gram NS for every matrix; unset lets
  // the plan pick per shape (muon.ns.algorithm is not consulted: the owner
  // chooses). muon.ns.gram_restarts must keep its default.
  absl::Status Start(
      const kernels::MuonHyperparameters& muon,
      const kernels::AdamWHyperparameters& adamw,
      std::optional<kernels::NsAlgorithm> ns_algorithm = std::nullopt);

  // Buffers of a declared tensor (after Start); NOT_FOUND naming it.
  absl::StatusOr<TensorBuffers> Buffers(const std::string& name) const;

  // One optimizer step: Muon on the workers (atomic: it commits on every
  // worker or on none), then AdamW here on the (averaged) gradients. A step
  // id at or below the last committed one is a no-op for the workers
  // (already_applied). AdamW runs exactly once per committed step id: on
  // the first answer that says the step committed, fresh or
  // already_applied, so retrying a step whose first call failed (its answer
  // lost, or its deadline passed) completes it without doubling anything.
  // Errors say whether the local worker applied the step; retry the same
  // step id until it is answered. A worker that restarted is attached again
  // (and the step sent again) once. Nothing else is retried.
  absl::StatusOr<StepResult> Step(int64_t step_id,
                                  const StepOptions& options = {});

  // The result of the step an async Step started (and OK with a default
  // result when none is pending). A failed step leaves the parameters as
  // they were and has released the trainer's stream.
  absl::StatusOr<StepResult> Wait();

  // The momentum of expert `expert` of a matrix if the local worker owns
  // it (NOT_FOUND otherwise: another rank's worker holds it). Both move in
  // 1 MiB chunks (Worker.StreamMomentum, LoadMomentum): any size passes.
  absl::StatusOr<std::vector<float>> OwnedMomentum(const std::string& name,
                                                   int64_t expert) const;
  // Restores it on the local worker (NOT_FOUND unless that worker owns it).
  absl::Status RestoreMomentum(const std::string& name, int64_t expert,
                               const std::vector<float>& values);
  // Restores the AdamW moments and step count (checkpoints).
  absl::Status RestoreAdamW(const std::string& name,
                            const std::vector<float>& exp_avg,
                            const std::vector<float>& exp_avg_sq);
  int64_t adamw_steps() const { return adamw_steps_; }
  void set_adamw_steps(int64_t steps) { adamw_steps_ = steps; }
  // The last step id whose AdamW part this client applied (-1: none): a
  // step at or below it is not stepped by AdamW again. Restoring a
  // checkpoint sets it to the checkpoint's last step.
  int64_t last_adamw_step() const { return last_adamw_step_; }
  void set_last_adamw_step(int64_t step_id) { last_adamw_step_ = step_id; }

  // The Newton-Schulz algorithm the job's current plan runs each matrix
  // with (by matrix name; an expert stack reports its first expert's), as
  // chosen by the planner per owner and shape. After Start; UNAVAILABLE
  // naming the coordinator when it cannot be reached. A single-process run
  // that must reproduce the service bit for bit uses these.
  absl::StatusOr<std::map<std::string, kernels::NsAlgorithm>> NsAlgorithms()
      const;

  // The AdamW moments of a tensor (for checkpoints and tests).
  absl::StatusOr<std::pair<const float*, const float*>> AdamWState(
      const std::string& name) const;

 private:
  struct Tensor {
    std::string name;
    bool muon = false;
    int64_t rows = 0, cols = 0;
    MatrixOptions matrix;
    scheduler::Layout layout = scheduler::Layout::kReplicated;
    int64_t elements = 0;        // this rank's gradient elements
    int64_t param_elements = 0;  // this rank's parameter elements
    int64_t offset = 0;          // grad at offset, param right after it
    void* cuda_grad = nullptr;   // LendCuda's buffers (CUDA trainers)
    void* cuda_param = nullptr;
    DType dtype = DType::kFloat32;  // of the lent buffers
    std::vector<float> exp_avg, exp_avg_sq;
  };
  Client(const ClientOptions& options,
         std::shared_ptr<grpc::Channel> coordinator,
         std::shared_ptr<grpc::Channel> worker);
  absl::Status EnsureJob(const kernels::MuonHyperparameters& muon,
                         const kernels::AdamWHyperparameters& adamw,
                         std::optional<kernels::NsAlgorithm> ns_algorithm);
  absl::Status WaitAndAttach();
  // The Step RPC, attaching again (once) to a worker that restarted.
  absl::Status CallStep(const v1::StepRequest& request,
                        v1::StepResponse* response);
  // The Step RPC and AdamW part (CUDA trainers: also the release of the
  // trainer's stream when the worker cannot do it).
  absl::StatusOr<StepResult> StepOnWorker(const v1::StepRequest& request,
                                          const StepOptions& options);
  Tensor* Find(const std::string& name);
  const Tensor* Find(const std::string& name) const;

  const ClientOptions options_;
  int dedicated_workers_ = 0;
  bool allow_momentum_reset_ = false;
  std::string checkpoint_dir_;
  int64_t checkpoint_every_ = 0;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<v1::Worker::Stub> worker_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> index_;
  std::optional<SharedMemorySegment> segment_;
  kernels::AdamWHyperparameters adamw_;
  kernels::CpuKernels kernels_;
  int64_t adamw_steps_ = 0;
  int64_t last_adamw_step_ = -1;
  bool started_ = false;
  // CUDA trainers.
  std::unique_ptr<client_internal::CudaStepSignals> signals_;
  std::future<absl::StatusOr<StepResult>> pending_;
};

}  // namespace muonps

#endif  // MUONPS_CLIENT_CLIENT_H_
