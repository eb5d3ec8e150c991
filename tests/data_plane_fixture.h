// Shared setup of the data-plane integration tests: one muonps-coordinator
// and N muonps-worker processes on loopback, N trainer ranks in the test
// process (one muonps::Client each, trainer rank r lending its buffers to
// worker r, steps run from one thread per trainer), deterministic parameters
// and gradients for every layout, and a single-process reference of the
// same optimizer steps with the CPU kernels.
//
// Every process, socket, log and shared-memory segment a fixture starts is
// removed when it is destroyed, after a failed assertion too; a failed test
// prints the processes' logs. Thread-compatible: the test's main thread
// drives the fixture; RunStep runs one thread per trainer and joins them.
#ifndef MUONPS_TESTS_DATA_PLANE_FIXTURE_H_
#define MUONPS_TESTS_DATA_PLANE_FIXTURE_H_

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "kernels/cpu/cpu_kernels.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "scheduler/plan_types.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace testing {

// How every trainer declares a matrix, in the service's terms (the
// reference reads them; the trainers hand the client its own options).
struct MatrixDeclOptions {
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  int32_t layer = 0;
  int64_t experts = 1;
  bool shard_params = true;
  // row_sharded stacks: the trainers split the experts (whole), not rows.
  bool shard_experts = false;
};

// A Muon matrix (or expert stack) as every trainer declares it.
struct MatrixDecl {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  MatrixDeclOptions options;
};

// An AdamW tensor as every trainer declares it.
struct TensorDecl {
  std::string name;
  int64_t elements = 0;
  scheduler::Layout layout = scheduler::Layout::kUnreduced;
};

// A model: what every trainer declares, and the job's hyperparameters.
struct ModelDecl {
  std::vector<MatrixDecl> matrices;
  std::vector<TensorDecl> tensors;
  kernels::MuonHyperparameters muon;
  kernels::AdamWHyperparameters adamw;
};

// Five small matrices over layers 0..2, all with `layout` (and
// `shard_params` when row_sharded): 64x64 twice (a same-shape batch), a
// tall 48x32, a wide 32x80 and a 3-expert stack of 40x24 (whose 40 rows do
// not split evenly over 3 trainers); two AdamW tensors, one unreduced and
// one replicated. Muon lr 0.02, weight decay 0.1, momentum 0.9, Nesterov.
ModelDecl SmallModel(scheduler::Layout layout, bool shard_params = true,
                     bool shard_experts = false);

// The same shapes with every layout in one job (replicated, unreduced,
// row_sharded with and without sharded parameters), no Nesterov and the
// match_rms_adamw learning-rate scaling.
ModelDecl MixedModel();

// Deterministic data. Gradients are multiples of 2^-10 in [-1, 1], so sums
// of a few ranks' gradients are exact in fp32 and the workers' mean is
// bit-identical to the reference's whatever order they add in. `rank` -1
// is the gradient every rank holds (replicated, row_sharded); ranks >= 0
// hold their own partial gradients (unreduced). `index` is into the full
// tensor (every expert, every row).
float InitialParam(int tensor, int64_t index);
float Gradient(int tensor, int64_t step, int rank, int64_t index);

// (matrix name, expert) -> the Newton-Schulz variant its owner runs.
using AlgorithmMap = std::map<std::pair<std::string, int64_t>, NsAlgorithm>;

// The model stepped in one process: the mean (or full) gradient of every
// step through CpuKernels::MuonStep per expert and AdamWStep, exactly as the
// job's hyperparameters say. Tensors are numbered as in ModelDecl:
// matrices first, then AdamW tensors.
class ReferenceModel {
 public:
  ReferenceModel(ModelDecl model, int trainers, AlgorithmMap algorithms);

  // One step with the clean gradients of `step`.
  absl::Status Step(int64_t step);

  // The full parameter (every expert, every row) of a tensor.
  const std::vector<float>& param(const std::string& name) const;
  // The momentum of one expert of a matrix (rows * cols floats).
  std::vector<float> momentum(const std::string& name, int64_t expert) const;
  // The mean gradient of tensor `tensor` at `step` as the workers form it.
  std::vector<float> MeanGradient(int tensor, int64_t step) const;
  // Zeroes one expert's momentum, as a new owner with nothing to restore
  // starts it.
  void ResetMomentum(const std::string& name, int64_t expert);
  // Sums the unreduced matrices' gradients as a plan's exchange nodes
  // (scheduler/node_exchange.h) do: each node's trainers left to right in
  // the order given, then the nodes' sums left to right
  // (scheduler::SumOverNodes).
  // Empty: every trainer left to right, as the rings.
  void SumOverNodes(std::vector<std::vector<int>> trainers_by_node) {
    nodes_ = std::move(trainers_by_node);
  }

 private:
  const ModelDecl model_;
  const int trainers_;
  std::vector<std::vector<int>> nodes_;
  const AlgorithmMap algorithms_;
  std::map<std::string, std::vector<float>> params_;
  std::map<std::string, std::vector<float>> momentum_;  // whole stacks
  std::map<std::string, std::vector<float>> exp_avg_, exp_avg_sq_;
  int64_t adamw_steps_ = 0;
  kernels::CpuKernels kernels_;
};

// Largest |actual - expected| / max(|expected|, rms(expected)) over the
// elements; infinity for different sizes or any non-finite actual value.
double MaxRelativeError(absl::Span<const float> actual,
                        absl::Span<const float> expected);

struct ClusterOptions {
  int workers = 1;
  int64_t io_timeout_ms = 10000;
  int64_t lease_ttl_ms = 3000;
  int64_t heartbeat_interval_ms = 300;
  // Extra flags of worker i's first process (--test_pause_at, say).
  std::map<int, std::vector<std::string>> worker_flags;
  // The trainers' clients' deadline for every call (ClientOptions.timeout).
  absl::Duration client_timeout = absl::Seconds(30);
  // The coordinator's --state_dir; empty: its state is in memory only.
  std::string state_dir;
  // The coordinator's --network_gbs (the links its plans weigh across
  // nodes); 0: its default.
  double network_gbs = 0;
  // The coordinator's --network_hop_us; < 0: its default.
  double network_hop_us = -1;
  // The address the coordinator and the workers listen on (--host); a
  // non-loopback one must be among the test certificate's names
  // (//tests/testdata:tls).
  std::string host = "127.0.0.1";
  // Worker i's own --host, where it differs (a worker inside a network
  // namespace), and the argv prefix its process starts under
  // (NetworkNamespace::Wrap's).
  std::map<int, std::string> worker_host;
  // Worker i's --node (the machine it says it runs on), kept across its
  // restarts.
  std::map<int, std::string> worker_node;
  std::map<int, std::vector<std::string>> worker_wrapper;
  // The job's allow_momentum_reset (Client::AllowMomentumReset): tests
  // that lose a worker and train on without a checkpoint set it.
  bool allow_momentum_reset = false;
  // HSDP's replica groups of the trainers (Client::SetReplicas); 0: none.
  int replicas = 0;
  // The job's momentum checkpoints (Client::SetCheckpointing); empty: none.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

// What one trainer's Step returned and how long the call took.
struct StepOutcome {
  absl::StatusOr<StepResult> result;
  absl::Duration elapsed;
};

// What one trainer's loop of steps did (RunTrainerLoops).
struct LoopOutcome {
  std::vector<StepOutcome> attempts;  // every call, in order
  bool finished = false;              // every step was answered OK
};

// What one trainer's retrying loop saw (RunRetryingLoops).
struct RetryingLoop {
  int64_t last_done = 0;  // the last step answered OK
  int64_t resets = 0;     // momentum_reset over the answered steps
  // Every failed attempt's status code, counted, and its first message.
  std::map<absl::StatusCode, int> failures;
  std::map<absl::StatusCode, std::string> first;
  std::string last_failure;
  // Every failed attempt: "step S at T: status" (T: absl::Now()).
  std::vector<std::string> attempts;
  bool finished = false;
};

// The last step every trainer's retrying loop finished, shared with the
// thread that injects failures meanwhile. Thread-safe.
class LoopProgress {
 public:
  explicit LoopProgress(int trainers) : done_(trainers) {
    for (auto& d : done_) d.store(0);
  }
  void Finished(int rank, int64_t step) { done_[rank].store(step); }
  // The step every trainer has finished.
  int64_t Slowest() const;
  // The step some trainer has finished.
  int64_t Fastest() const;
  // Waits until Slowest() >= step; false after `timeout`.
  bool WaitFor(int64_t step, absl::Duration timeout) const;
  // Ends the loops after `steps` more steps than the fastest trainer has
  // finished (a loop's own last step still bounds it): a test that injects
  // failures until it is done, however far recoveries moved the trainers
  // meanwhile, then lets them step a little further. Returns the last step.
  int64_t EndAfter(int64_t steps);
  // The last step a loop may start.
  int64_t end() const { return end_.load(); }

 private:
  std::vector<std::atomic<int64_t>> done_;
  std::atomic<int64_t> end_{std::numeric_limits<int64_t>::max()};
};

// How RunStep drives each trainer; the defaults write the clean gradients
// of the step and call Step at once on every rank.
struct StepScript {
  std::set<int> silent;                 // ranks that never call Step
  std::map<int, absl::Duration> delay;  // before writing and stepping
  // Runs on the rank's thread after its gradients are written (to poison
  // or replace them).
  std::function<void(int rank)> after_write;
  bool write_gradients = true;
};

// Every trainer's parameters (by rank, then tensor, as its buffers hold
// them) and every owned expert's momentum (by "name[expert]"; absent before
// its first step).
struct StateSnapshot {
  std::vector<std::map<std::string, std::vector<float>>> params;
  std::map<std::string, std::vector<float>> momentum;
  std::vector<int64_t> adamw_steps;
};

// What a trainer's loop saves after an answered step: its parameters (as
// its buffers hold them), the AdamW moments and step counts of its client.
struct SavedTrainer {
  int64_t step = -1;
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::pair<std::vector<float>, std::vector<float>>>
      moments;
  int64_t adamw_steps = 0;
  int64_t last_adamw_step = -1;
};

class DataPlaneFixture : public ::testing::Test {
 protected:
  DataPlaneFixture() = default;
  ~DataPlaneFixture() override;
  void TearDown() override;

  // Starts the coordinator and `options.workers` workers, then one trainer
  // per worker declaring `model` (all Starts concurrently), puts
  // InitialParam in their parameter buffers and waits until every worker
  // follows a plan of all the workers. Fails the test (fatally) otherwise,
  // except that with `start_status` a trainer's failed Start is stored
  // there (the first one) and StartJob returns at once.
  void StartJob(const ModelDecl& model, const ClusterOptions& options,
                absl::Status* start_status = nullptr);

  // Runs Step(step) on every rank not in script.silent, each on its own
  // thread, concurrently; entries of silent ranks are empty.
  std::vector<std::optional<StepOutcome>> RunStep(
      int64_t step, const StepScript& script = {});

  // Every trainer runs steps [first, last] as a training loop does, each on
  // its own thread: it writes a step's clean gradients once, calls Step
  // until it is answered OK (at most `attempts` calls), then goes on.
  std::vector<LoopOutcome> RunTrainerLoops(int64_t first, int64_t last,
                                           int attempts);
  // The same as a user's loop retries: Step until it is answered, pausing
  // 50 ms after a failure, for at most `per_step` per step; every finished
  // step goes to `progress` (may be null).
  // `after_step` (may be empty) runs on rank r's thread once its step is
  // answered OK, before it writes the next step's gradients.
  std::vector<RetryingLoop> RunRetryingLoops(
      int64_t first, int64_t last, LoopProgress* progress,
      absl::Duration per_step = absl::Seconds(60),
      std::function<void(int rank, int64_t step)> after_step = {});

  // Writes rank `rank`'s clean gradients of `step` into its buffers.
  void WriteGradients(int rank, int64_t step);

  // The buffers of a tensor of rank `rank` (fails the test if absent).
  TensorBuffers Buffers(int rank, const std::string& name) const;
  Client& client(int rank) { return *clients_.at(rank); }
  // Trainer `rank` stops and a new one starts in its place, as a trainer
  // process restarted between steps does: the new client is declared and
  // started (waiting for a coordinator that is down, within its timeout)
  // and gets what the old one had after its last answered step (its
  // parameters, AdamW moments and steps). Call from the rank's own thread
  // (RunRetryingLoops' after_step) or with no step running; Start's error,
  // if any (the rank then has no client).
  absl::Status RestartTrainer(int rank);
  // Trainer `rank`'s state now, as its loop saves it after step `step`.
  absl::StatusOr<SavedTrainer> SaveTrainer(int rank, int64_t step) const;
  // As RestartTrainer, from `saved` (perhaps older than the last answered
  // step: a trainer killed after its worker committed a step and before it
  // saved); with `resume`, the new client says where it resumed
  // (Client::ResumeAfter(saved.step)).
  absl::Status RestartTrainerFrom(int rank, const SavedTrainer& saved,
                                  bool resume);

  StateSnapshot Snapshot();

  // Expects every rank's parameters (its rows, for sharded parameters),
  // AdamW parameters and every owner's momentum to match `reference`
  // within `tolerance` (MaxRelativeError).
  void ExpectMatchesReference(const ReferenceModel& reference,
                              double tolerance);

  // The momentum of one expert from the worker `worker` (an index).
  absl::StatusOr<std::vector<float>> Momentum(int worker,
                                              const std::string& matrix,
                                              int64_t expert);

  // The plan every worker followed when StartJob returned, and who owns
  // what in it.
  const v1::Plan& plan() const { return plan_; }
  int WorkerIndex(const std::string& worker_id) const;
  int Owner(const std::string& matrix, int64_t expert) const;
  // The worker index at rank `plan_rank` of the plan.
  int WorkerAtPlanRank(int plan_rank) const;
  // The Newton-Schulz algorithm each expert runs with under plan(): its
  // owner's batch parts laid over the step schedule's stacks, as the
  // workers do (scheduler/step_schedule.h; the model's matrices are the
  // job's, in order). A failed test if the plan does not translate.
  AlgorithmMap PlannedAlgorithms() const;

  // SIGKILLs worker `worker` and reaps it.
  void KillWorker(int worker);
  // Starts worker `worker` again (same id and socket, without its
  // worker_flags); its trainer's client attaches again at its next Step.
  void RestartWorker(int worker);
  // Waits up to `timeout` for worker `worker`'s process to exit; its wait
  // status (as waitpid's).
  absl::StatusOr<int> WaitForWorkerExit(int worker, absl::Duration timeout);
  // Waits until worker `worker` stopped itself (--test_pause_at).
  absl::Status WaitUntilStopped(int worker, absl::Duration timeout);
  // Waits until every worker follows one plan of all of them; plan() is
  // then that plan.
  absl::Status WaitForFullPlan(absl::Duration timeout);
  // Whether `plan` is one a job of model() settles on: for trainers that
  // hold whole experts, one made with every trainer's rank.
  bool KnowsWholeExpertHolders(const v1::Plan& plan) const;
  // How many experts of stacks held whole `plan` leaves with the worker
  // whose trainer holds them (WorkerLoad::trainer_shard).
  static int ExpertsOwnedByHolders(const v1::Plan& plan);
  // The coordinator's latest plan of the job (GetPlan), and the job's
  // members (ListWorkers), each a call of 5 s at most.
  absl::StatusOr<v1::Plan> LatestPlan();
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  // SIGKILLs the coordinator and reaps it.
  void KillCoordinator();
  // Starts the coordinator again with the same flags on the same port
  // (logging to a new file) and waits until it listens.
  void RestartCoordinator();
  // The running coordinator's process, and a stub to it.
  ChildProcess& coordinator_process() { return *coordinator_; }
  v1::Coordinator::Stub& coordinator_stub() { return *coordinator_stub_; }
  // Worker `worker`'s status from its local socket.
  absl::StatusOr<v1::WorkerStatus> WorkerStatus(int worker);
  // Waits (15 s at most, else a failure) until worker `worker`'s status
  // says its restored_step (`restored`) or last_checkpoint_step is `step`.
  void WaitForCheckpointStatus(int worker, int64_t step, bool restored);
  // Sends `signal` to worker `worker`.
  void SignalWorker(int worker, int signal);
  // Worker `worker`'s process id.
  pid_t WorkerPid(int worker) const {
    return workers_.at(worker).process->pid();
  }
  // What worker `worker`'s current process logged so far.
  std::string WorkerLog(int worker) const {
    return workers_.at(worker).process->Log();
  }

  int workers() const { return static_cast<int>(workers_.size()); }
  // Trainer ranks (one per worker StartJob started; JoinDedicatedWorker's
  // have none).
  int trainers() const { return static_cast<int>(clients_.size()); }
  // Forgets the last worker started (a dedicated one that left the job for
  // good, as when a pool is scaled down); its process must have exited.
  void ForgetLastWorker() { workers_.pop_back(); }
  // Starts one more worker, w<workers()>, with --dedicated (no trainer):
  // the coordinator plans it in and moves matrices to it. WaitForFullPlan
  // then waits for a plan that has it.
  void JoinDedicatedWorker();
  // Starts a worker `id` of the job that no trainer attaches to and that
  // is not dedicated (one started by mistake, a spare): a standby beyond
  // the job's trainers (JobSpec.trainers). Not one of workers(): the
  // caller owns its process.
  std::unique_ptr<ChildProcess> StartStandbyWorker(const std::string& id);
  const std::string& coordinator_address() const {
    return coordinator_address_;
  }
  const ModelDecl& model() const { return model_; }
  const std::string& job() const { return job_; }
  const std::string& log_dir() const { return log_dir_; }

 private:
  struct WorkerProcess {
    std::string id;
    std::string socket;
    std::unique_ptr<ChildProcess> process;
    std::unique_ptr<v1::Worker::Stub> stub;
  };

  void StartCoordinator(const ClusterOptions& options);
  void StartWorker(int index, const ClusterOptions& options);
  // A worker's command line: `index`'s extra flags and wrapper, if any.
  std::vector<std::string> WorkerArgv(const std::string& id,
                                      const std::string& socket, int index,
                                      const ClusterOptions& options) const;
  void StartTrainers(absl::Status* start_status);
  // A client for trainer `rank` with the model declared, not started.
  absl::StatusOr<std::unique_ptr<Client>> DeclareTrainer(int rank) const;

  ModelDecl model_;
  ClusterOptions options_;
  std::string job_;
  std::string log_dir_;
  std::string socket_dir_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::string> coordinator_argv_;
  int coordinator_starts_ = 0;
  std::string coordinator_address_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
  std::vector<WorkerProcess> workers_;
  std::vector<std::unique_ptr<Client>> clients_;
  v1::Plan plan_;
};

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_DATA_PLANE_FIXTURE_H_
