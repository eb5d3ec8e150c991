// muonps::Client: a trainer rank's handle on muonps. It declares the
// model's matrices (optimized by Muon on the workers) and its other tensors
// (stepped with AdamW: by this client for host trainers, by the trainer
// itself for CUDA trainers), lends their gradient and parameter buffers to
// the local worker, and triggers steps. Host trainers lend one POSIX
// shared-memory segment the client creates (Buffers() places the model in
// it); GPU trainers (options.device "cuda:N") lend their own CUDA buffers
// by CUDA IPC (LendCuda), and the worker on the same GPU updates their
// parameters in place.
//
// Lifecycle: Create, AddMatrix/AddTensor for every tensor and SetGroup for
// the parameter groups (identical on all ranks), Start (creates the job if
// needed, waits for the local worker's plan, attaches), then Buffers() to
// place the model in the lent memory, and Step() once per optimizer step
// after writing the gradients, with each group's values by index. Errors
// are absl::Status values naming the tensor or field.
//
// Not thread-safe: one trainer thread uses a Client, except that
// GradientReady may run on another (a gradient hook's). Not copyable. This
// header needs absl and the standard library only (the values it takes are
// in client/client_types.h).
#ifndef MUONPS_CLIENT_CLIENT_H_
#define MUONPS_CLIENT_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client_types.h"

namespace muonps {

class Client {
 public:
  // A client for `options` (no connection is made yet). INVALID_ARGUMENT
  // naming the field for an empty coordinator, job or worker_socket, a
  // rank outside [0, trainer_count), or a device other than "cpu" and
  // "cuda:N"; a credential file that cannot be read is named too.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  // Waits for an async step still in flight; host trainers' segment goes.
  ~Client();

  // The largest dimension and element count a tensor may declare: far
  // above any model's, low enough that sizes, offsets and row ranges
  // computed from them never overflow.
  static constexpr int64_t kMaxDimension = (int64_t{1} << 31) - 1;
  static constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
  // Parameter groups are numbered [0, kMaxParamGroups).
  static constexpr int kMaxParamGroups = 1024;

  // Declares a Muon matrix (before Start). INVALID_ARGUMENT naming the
  // field for bad shapes (a dimension below 1 or above kMaxDimension, more
  // than kMaxTensorElements in all) or a duplicate name.
  absl::Status AddMatrix(const std::string& name, int64_t rows, int64_t cols,
                         const MatrixOptions& options = {});

  // Declares a tensor stepped with AdamW (before Start); `layout` is
  // kUnreduced (gradients averaged over trainers by the workers) or
  // kReplicated. A CUDA trainer steps these itself and declares only the
  // unreduced ones, whose gradients the workers then average in place.
  absl::Status AddTensor(const std::string& name, int64_t elements,
                         TensorLayout layout);

  // Before Start: puts declared tensors, Muon matrices and AdamW tensors
  // alike, in parameter group `group` (0 <= group < kMaxParamGroups). The
  // group travels with the tensor's binding when Start attaches, and every
  // step's StepOptions::groups[group] then applies to it; a tensor in no
  // group takes the step's own values. The same on every rank. All or
  // nothing: INVALID_ARGUMENT naming `group` out of range, or `names[i]`
  // undeclared or already in a group (this one included);
  // FAILED_PRECONDITION after Start.
  absl::Status SetGroup(int group, const std::vector<std::string>& names);

  // CUDA trainers: lends a declared matrix's (or unreduced AdamW tensor's)
  // gradient and parameter, device memory of options.device holding
  // Buffers()' element counts of `dtype` (the worker keeps fp32 momentum,
  // widens bf16 gradients and rounds each updated parameter once). The
  // trainer keeps them allocated and in place while attached; sub-blocks of
  // larger allocations (PyTorch's caching allocator) are fine. A job matrix
  // may lend no gradient (`grad` null): every Step then needs its gradient
  // placed (PlaceGradient), and the trainer keeps no buffer for it. Before
  // Start; FAILED_PRECONDITION for a host client, NOT_FOUND for an
  // undeclared name, INVALID_ARGUMENT naming the matrix for a null `param`
  // (or `grad` of an AdamW tensor) or one lent twice (memory of the wrong
  // device is named by Start).
  absl::Status LendCuda(const std::string& name, void* grad, void* param,
                        BufferDType dtype = BufferDType::kFloat32);

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

  // Before Start, and before any row-sharded matrix is declared: HSDP (a
  // 2-D device mesh, replicate x shard; JobSpec.replicas). The trainers
  // form `replicas` replica groups of S = trainer_count / replicas ranks
  // each, ranks r*S .. r*S+S-1 (the mesh's row-major order); a row-sharded
  // matrix's rows are split over the S ranks of a group, this rank holding
  // TrainerRowRange(rows, trainer_rank % S, S), and every group holds the
  // same gradients. 0 or 1 (the default): none. The same on every rank.
  // INVALID_ARGUMENT naming `replicas` below 0 or not dividing
  // trainer_count; FAILED_PRECONDITION naming it after Start or once a
  // row-sharded matrix is declared (its rows would change).
  absl::Status SetReplicas(int replicas);

  // Creates the segment (host trainers) and the job (a job of the same name
  // must have the same matrices), waits for the local worker to follow a
  // plan, attaches every tensor with its group. INVALID_ARGUMENT naming the
  // field for hyperparameters out of range (checked before anything is
  // sent) or no matrix declared; FAILED_PRECONDITION for a second call or a
  // CUDA tensor not lent; the service's errors otherwise, naming the call.
  absl::Status Start(const MuonOptions& muon, const AdamWOptions& adamw);

  // Buffers of a declared tensor (after Start for host trainers); NOT_FOUND
  // naming it. The pointers stay valid until the Client is destroyed.
  absl::StatusOr<TensorBuffers> Buffers(const std::string& name) const;

  // A trainer that restarted and loaded its own state saved after step
  // `step` (-1: the initial parameters): its parameters, and the AdamW
  // moments and step count it restored (RestoreAdamW, set_adamw_steps),
  // hold every step up to it. Say so before the first Step after loading:
  // that Step (every attempt, until one is answered) tells the workers.
  // When they had committed the next step already (an earlier trainer of
  // this rank died after its worker committed it), the worker repairs these
  // parameters from a peer's trainer that holds it and answers
  // already_applied (StepResult::repaired): AdamW then steps as for any
  // committed step, and training goes on exactly. Where no repair can be
  // made (no other trainer, more than one step behind, a trainer keeping
  // only its rows of a row-sharded matrix) the step fails with DATA_LOSS
  // naming the state to reload. Sets last_adamw_step to `step`.
  // INVALID_ARGUMENT for step < -1.
  absl::Status ResumeAfter(int64_t step);

  // One optimizer step: Muon on the workers (atomic: it commits on every
  // worker or on none), then AdamW here on the (averaged) gradients of host
  // trainers, each tensor with its group's adamw_lr and adamw_weight_decay.
  // Every value is checked before anything is sent: INVALID_ARGUMENT naming
  // the field (`lr`, `groups[2].adamw_weight_decay`, ...) for NaN or an
  // infinity, more than kMaxParamGroups groups, or fewer groups than
  // SetGroup used. A step id at or below the last committed one is a no-op
  // for the workers (already_applied). AdamW runs exactly once per
  // committed step id: on the first answer that says the step committed,
  // fresh or already_applied, so retrying a step whose first call failed
  // (its answer lost, or its deadline passed) completes it without doubling
  // anything. A step id this client never sent before that the workers
  // had committed already (an earlier trainer of this rank stepped it, then
  // died) is FAILED_PRECONDITION naming the last committed step: these
  // parameters miss it, so reload state saved after it (a trainer that
  // says where it resumed, ResumeAfter, is repaired instead). Errors say
  // whether the local worker applied the step; retry the same step id until it
  // is answered. A worker that restarted is attached again (and the step sent
  // again) once. Nothing else is retried.
  absl::StatusOr<StepResult> Step(int64_t step_id,
                                  const StepOptions& options = {});

  // CUDA trainers, after Start: the gradient of job matrix `name` (lent
  // with LendCuda) is final for the next Step once `stream` (nullptr: the
  // legacy default stream) gets here. Records that matrix's own
  // interprocess event (TensorBinding.grad_ready_event) on `stream` and
  // returns once it is enqueued, with no host wait for the device, so the
  // worker moves and orthogonalizes the matrix while backward still
  // produces the others. A trainer calls it once a matrix's gradient is
  // final, e.g. from a post-accumulate-grad hook, and again after any later
  // write of that gradient before the Step call (accumulation, clipping, a
  // copy into it): the step reads the last record made before the call.
  // Step also records, on its own stream, the event of every matrix not
  // marked ready since the previous Step, so a trainer that never calls
  // GradientReady, or a matrix with no gradient this iteration, is ordered
  // by the step's stream as before. While the worker has yet to answer a
  // step (an async Step), first waits on the host for that answer: a record
  // made earlier could be taken as that step's. May run on another thread
  // than Step and Wait (PyTorch runs gradient hooks on its autograd
  // thread). FAILED_PRECONDITION for a host client; NOT_FOUND naming the
  // matrix unless `name` is a declared job matrix (AdamW tensors have no
  // event); INVALID_ARGUMENT before Start; CUDA's error naming the matrix
  // when the record fails.
  absl::Status GradientReady(const std::string& name, CUstream_st* stream);

  // CUDA trainers, after Start, for the next Step only: the gradient of job
  // matrix `name` lies at `data` (device memory of this trainer's GPU, as
  // many values of its lent dtype as its lent buffer) instead of the buffer
  // lent with LendCuda, and the worker reads it there, in place: a gradient
  // backward allocated goes to the step with no copy, and its lent buffer
  // needs no zeroing. The memory must stay allocated and unwritten until
  // the worker read it: after a Step without forward_waits, until the
  // trainer's stream passes the step's wait; with forward_waits, until
  // WaitForParameters(stream, 0). Matrices not placed are read from their
  // lent buffers; one that lent none refuses the Step, naming it
  // (INVALID_ARGUMENT). FAILED_PRECONDITION
  // for a host client; NOT_FOUND naming the matrix unless it is a declared
  // job matrix; INVALID_ARGUMENT naming it before Start, or for memory that
  // is not this GPU's device memory or has no IPC handle (a stream-ordered
  // pool, PyTorch's expandable segments).
  absl::Status PlaceGradient(const std::string& name, const void* data);

  // CUDA trainers, after Start: zeroed device memory of this GPU for matrix
  // `name`'s gradient (as many values of its lent dtype), which
  // PlaceGradient always takes, whatever allocator the trainer's framework
  // uses (PyTorch's expandable segments have no IPC handle): a gradient
  // buffer of the trainer's for the steps whose gradient does not lie
  // where backward left it (a trainer whose forward waits per layer adds
  // into it). The caller owns it and frees it with FreeCudaMemory once no
  // step reads it, with or without this client. Errors as PlaceGradient's
  // for `name`; RESOURCE_EXHAUSTED naming it when the GPU is full.
  absl::StatusOr<void*> AllocateGradient(const std::string& name);
  // Frees memory AllocateGradient returned (null: nothing).
  static absl::Status FreeCudaMemory(void* data);

  // CUDA trainers whose steps return with forward_waits: makes `stream`
  // (nullptr: the legacy default stream) wait, on the device, until the
  // last step enqueued has written the parameters of the first `matrices`
  // job matrices this client declared (in declaration order), or wrote all
  // it will; kAllParameters: the whole step. 0 orders what must follow the
  // worker's last read of the step's gradients and its write of the AdamW
  // means (zeroing or copying gradients, the trainer's AdamW). Returns once
  // enqueued; OK when no step was enqueued yet. FAILED_PRECONDITION for a
  // host client; INVALID_ARGUMENT for `matrices` < -1 or above the job's.
  static constexpr int64_t kAllParameters = -1;
  absl::Status WaitForParameters(CUstream_st* stream, int64_t matrices);

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

  // The AdamW moments of a host trainer's tensor (for checkpoints and
  // tests), owned by the client and valid until the next Step or
  // RestoreAdamW; NOT_FOUND unless `name` is an AdamW tensor.
  absl::StatusOr<std::pair<const float*, const float*>> AdamWState(
      const std::string& name) const;
  // Restores a tensor's AdamW moments (checkpoints); INVALID_ARGUMENT
  // naming the tensor unless both hold its element count.
  absl::Status RestoreAdamW(const std::string& name,
                            const std::vector<float>& exp_avg,
                            const std::vector<float>& exp_avg_sq);
  // AdamW's step count, shared by the client's AdamW tensors.
  int64_t adamw_steps() const;
  void set_adamw_steps(int64_t steps);
  // The last step id whose AdamW part this client applied (-1: none): a
  // step at or below it is not stepped by AdamW again. Restoring a
  // checkpoint sets it to the checkpoint's last step.
  int64_t last_adamw_step() const;
  void set_last_adamw_step(int64_t step_id);

  // The Newton-Schulz algorithm (kNs5 or kGram) the job's current plan
  // runs each matrix with (by matrix name; an expert stack reports its
  // first expert's), as chosen by the planner per owner and shape. After
  // Start; UNAVAILABLE naming the coordinator when it cannot be reached. A
  // single-process run that must reproduce the service bit for bit uses
  // these.
  absl::StatusOr<std::map<std::string, NewtonSchulz>> NsAlgorithms() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace muonps

#endif  // MUONPS_CLIENT_CLIENT_H_
