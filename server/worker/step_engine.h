// A worker's part of the data plane: the trainer's lent buffers, the
// momentum of the matrices it owns, and one optimizer step run together
// with the other workers of the plan over a Transport.
//
// Per step: agree on the step id and on gradient finiteness (any NaN/Inf
// anywhere rejects the step on every worker before anything changes); then
// per bucket of the step schedule move gradients to owners (replicated:
// nothing; unreduced: mean reduce; row_sharded: gather rows), run momentum
// and Newton-Schulz on the owner, move the update back (broadcast, or
// scatter rows) and apply weight decay and the scaled update in place in
// the trainer's parameters; finally average the AdamW tensors' gradients
// (unreduced) for the client. Thread-safe (one step at a time).
#ifndef MUONPS_SERVER_WORKER_STEP_ENGINE_H_
#define MUONPS_SERVER_WORKER_STEP_ENGINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/shared_memory.h"
#include "kernels/cpu/cpu_kernels.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/worker.pb.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// Builds the transport for a plan version: (rank, peer addresses by rank,
// session) -> a connected transport.
using TransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
        int rank, const std::vector<std::string>& addresses, uint64_t session)>;

class StepEngine {
 public:
  StepEngine(std::string worker_id, TransportFactory make_transport);
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;

  // A new plan version with the job's spec and every worker's data address
  // (by worker id). Momentum of matrices this worker keeps owning survives;
  // the transport is rebuilt at the next step.
  absl::Status SetPlan(const v1::JobSpec& job, const v1::Plan& plan,
                       const std::map<std::string, std::string>& addresses);

  // Maps the trainer's segment and checks every binding against the job:
  // every job matrix bound once with the right element count, offsets
  // inside the segment, fp32 buffers. FAILED_PRECONDITION before a plan,
  // and while the plan's worker count differs from the trainer count (the
  // other workers have not joined yet; the client retries).
  absl::StatusOr<v1::AttachResponse> Attach(const v1::AttachRequest& request);

  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request);

  int64_t last_step() const;

  // The momentum of expert `expert` of `matrix` if this worker owns it and
  // has stepped it; NOT_FOUND otherwise.
  absl::StatusOr<std::vector<float>> Momentum(const std::string& matrix,
                                              int64_t expert) const;
  // Restores it: NOT_FOUND unless this worker owns the expert in the
  // current plan; INVALID_ARGUMENT for a wrong size or non-finite values.
  absl::Status SetMomentum(const std::string& matrix, int64_t expert,
                           std::vector<float> values);

 private:
  struct Binding {
    float* grad = nullptr;
    float* param = nullptr;
    int64_t elements = 0;
    // Row-sharded gradient with the whole parameter on the trainer.
    bool full_param = false;
    scheduler::Layout layout = scheduler::Layout::kReplicated;
  };
  struct StepContext;

  absl::Status EnsureTransport() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AgreeOnStep(const v1::StepRequest& request,
                           const std::string& local_problem, StepContext* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string FirstNonFinite() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ToOwners(const scheduler::Bucket& bucket, StepContext* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Compute(const scheduler::Bucket& bucket, StepContext* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FromOwners(const scheduler::Bucket& bucket,
                          const v1::StepRequest& request, StepContext* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AverageAdamWGradients(StepContext* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rows of a row_sharded matrix that trainer `trainer_rank` holds.
  std::pair<int64_t, int64_t> RowRange(int64_t rows, int trainer_rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string worker_id_;
  const TransportFactory make_transport_;
  mutable absl::Mutex mu_;
  // The plan.
  v1::JobSpec job_ ABSL_GUARDED_BY(mu_);
  int64_t plan_version_ ABSL_GUARDED_BY(mu_) = 0;
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<scheduler::MatrixSpec> matrices_ ABSL_GUARDED_BY(mu_);
  scheduler::OwnershipPlan plan_ ABSL_GUARDED_BY(mu_);
  scheduler::StepSchedule schedule_ ABSL_GUARDED_BY(mu_);
  // NS algorithm of each of this worker's batches, by (min dim, max dim).
  std::map<std::pair<int64_t, int64_t>, kernels::NsAlgorithm> algorithms_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::Transport> transport_ ABSL_GUARDED_BY(mu_);
  // Momentum of owned experts, by "name[expert]".
  std::map<std::string, std::vector<float>> momentum_ ABSL_GUARDED_BY(mu_);
  int64_t momentum_resets_ ABSL_GUARDED_BY(mu_) = 0;
  // The trainer's buffers.
  std::optional<SharedMemorySegment> segment_ ABSL_GUARDED_BY(mu_);
  int trainer_rank_ ABSL_GUARDED_BY(mu_) = 0;
  int trainer_count_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<Binding> matrix_bindings_ ABSL_GUARDED_BY(mu_);  // by matrix
  std::map<std::string, Binding> adamw_bindings_ ABSL_GUARDED_BY(mu_);
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = -1;
  kernels::CpuKernels kernels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_ENGINE_H_
