// Test fixture: three StepEngines in one process, each with its "trainer"
// in host memory, over loopback TCP transports (the worker's data path
// without processes or a coordinator), optionally with dedicated engines,
// a transport that fails or stalls at a chosen call of a chosen step, and
// the same steps run by the CPU kernels in one process for bitwise checks.
// Thread-compatible: the test's thread drives it; steps run one thread per
// engine.
#ifndef MUONPS_SERVER_WORKER_STEP_ENGINE_FIXTURE_H_
#define MUONPS_SERVER_WORKER_STEP_ENGINE_FIXTURE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "lending/step_record.h"
#include "server/worker/step_control.h"
#include "server/worker/step_engine.h"
#include "server/worker/wire.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace worker {

constexpr int kWorkers = 3;

// The engine's calls as the worker's edge makes them from the wire
// messages a coordinator and a trainer send (wire.h).
absl::Status SetPlanFromProto(
    StepEngine& engine, const v1::JobSpec& job, const v1::Plan& plan,
    const std::map<std::string, std::string>& addresses);
absl::StatusOr<AttachResponse> AttachFromProto(
    StepEngine& engine, const v1::AttachRequest& request);
absl::StatusOr<StepResponse> StepFromProto(StepEngine& engine,
                                           const v1::StepRequest& request,
                                           const StepCancelled& cancelled = {});

struct MatrixDecl {
  std::string name;
  int64_t rows, cols;
  v1::Layout layout;
};

// Same-shape pairs (one stack per owner), all three layouts.
const std::vector<MatrixDecl>& Matrices();
float GradValue(int64_t step, int matrix, int trainer, int64_t i);

// A trainer's lent memory: plain vectors, found by tensor name.
struct Trainer {
  int rank = 0;
  std::map<std::string, std::vector<float>> grad, param;
  // An unreduced AdamW tensor whose gradient the workers average.
  std::vector<float> bias_grad = std::vector<float>(7),
                     bias = std::vector<float>(7);
  // bf16 trainers lend these instead (same element counts).
  bool bf16 = false;
  // What CheckIntact answers (a truncated segment, say).
  absl::Status intact;
  // Its step record's words (lending/step_record.h), where the fixture
  // lends one (StepEngineTest::LendsRecord).
  std::array<uint64_t, kStepRecordBytes / 8> record{};
  std::map<std::string, std::vector<uint16_t>> grad16, param16;
};

// The job's hyperparameters as the workers run them.
kernels::MuonHyperparameters MuonFromJob();
v1::JobSpec Job(int dedicated = 0, int64_t bucket_bytes = 0);
// Matrix m is owned by worker owners[m], of `workers` ("w0".."wN"; the
// last `dedicated` of them have no trainer).
v1::Plan PlanWithOwnerList(int64_t version, const std::vector<int>& owners,
                           int workers = kWorkers, int dedicated = 0);
// Matrix m is owned by worker (m + shift) % kWorkers.
v1::Plan PlanWithOwners(int64_t version, int shift);
// rep.a and rep.b (24 x 40) both on w0, in one plan batch run as `parts`
// (count, algorithm) and predicted at `predicted_seconds` (each part at
// its share); the other matrices spread over w1 and w2 (no batches: one
// NS5 call each, no prediction).
v1::Plan PairOnW0(const std::vector<std::pair<int64_t, v1::NsAlgorithm>>& parts,
                  double predicted_seconds = 0);

// Where a worker's transport fails: at call `call` (0-based, counting
// Send, Recv, ReduceSum and Broadcast) of the first round of step `step`.
// With `stall` the call instead waits that long first (a frozen peer).
struct Fault {
  int64_t step = -1;
  int64_t call = -1;
  absl::Duration stall = absl::ZeroDuration();
};

// A worker's Fault as its transports see it: armed by the step's first
// round (the engine's StepHook), fired once.
struct FaultState {
  absl::Mutex mu;
  Fault fault ABSL_GUARDED_BY(mu);
  bool armed ABSL_GUARDED_BY(mu) = false;
  bool fired ABSL_GUARDED_BY(mu) = false;
  int64_t counted ABSL_GUARDED_BY(mu) = 0;
};

// Matrix m's whole gradient of `step` as the owner uses it: the trainers'
// mean summed in trainer order (unreduced), else trainer 0's; `bf16`: each
// part as lent in bf16, widened.
// `nodes`: the trainers by node of a plan's exchange nodes, whose sum
// adds as scheduler/node_exchange.h says; empty: trainer order.
std::vector<float> WholeGradient(
    int64_t step, int m, bool bf16,
    const std::vector<std::vector<int>>& nodes = {});

// The trainers' parameters as the kernels make them in one process, each
// matrix orthogonalized with its entry in `algorithms` (NS5 if none).
class ReferenceSteps {
 public:
  // `nodes`: WholeGradient's.
  explicit ReferenceSteps(std::map<std::string, NsAlgorithm> algorithms = {},
                          DType update_dtype = DType::kFloat32,
                          std::vector<std::vector<int>> nodes = {});
  // One step of every matrix with the trainers' gradients of `step`.
  void Step(int64_t step);
  const std::vector<float>& param(const std::string& name) const {
    return param_.at(name);
  }

 private:
  kernels::CpuKernels kernels_;
  const std::map<std::string, NsAlgorithm> algorithms_;
  const std::vector<std::vector<int>> nodes_;
  std::map<std::string, std::vector<float>> param_, momentum_;
};

class StepEngineTest : public ::testing::Test {
 protected:
  // Workers with no trainer, ranked after the kWorkers with one.
  virtual int Dedicated() const { return 0; }
  virtual absl::Duration IoTimeout() const { return absl::Seconds(10); }
  // The precision every engine's updates are rounded to (CpuStepBackend).
  virtual DType UpdateDtype() const { return DType::kFloat32; }
  // Every trainer keeps the whole parameter of the row-sharded matrices
  // too (so every trainer lends its staging to its peers:
  // staging_windows.h).
  virtual bool WholeParams() const { return false; }
  // The engines lend and open staging windows (CpuStepBackend's lender).
  virtual bool PeerWrites() const { return true; }
  // The engines may apply updates before the commit (StepBackend).
  virtual bool ApplyEarly() const { return true; }
  // Each trainer lends its step record (Trainer::record).
  virtual bool LendsRecord() const { return false; }
  // Control messages on a TCP mesh of their own beside the data's
  // (transport/split_transport.h), as a GPU worker's beside NCCL: a tree
  // of ControlTreeFanout() (a star of the few ranks here unless smaller).
  virtual bool SplitControl() const { return false; }
  virtual int ControlTreeFanout() const { return kControlTreeFanout; }

  void SetUp() override;
  void TearDown() override;

  // Builds TCP transports with the secret the engine hands over (the one
  // SetUp gives every engine, as the worker's agent does on joining),
  // wrapped to fail as `faults_[worker]` says.
  TransportFactory Connector(int worker);
  // The dedicated engines step whenever the others do, as the worker
  // daemon's follow thread runs them.
  void StartFollowing();
  void SetPlanEverywhere(const v1::Plan& plan, int64_t bucket_bytes = 0);
  // Every trainer lends bf16 buffers (params 0.5, as the fp32 ones).
  void UseBf16Everywhere();
  void AttachEverywhere(int64_t trainer_pid = 0, bool with_bias = false);
  // The request AttachEverywhere sends for worker w.
  v1::AttachRequest AttachRequestOf(int w, int64_t trainer_pid, bool with_bias);
  void WriteGradients(int64_t step);
  void WriteGradientsOf(int w, int64_t step);
  // Every engine steps `step` at once; the statuses by worker. `edit`
  // changes worker w's request first; `cancelled` gives worker w's call
  // its StepCancelled.
  std::vector<absl::StatusOr<StepResponse>> StepEverywhere(
      int64_t step,
      const std::function<void(int, v1::StepRequest*)>& edit = nullptr,
      const std::function<StepCancelled(int)>& cancelled = nullptr);
  // Every trainer runs steps [first, last] as a training loop does: it
  // writes a step's gradients once, then calls Step until it succeeds (at
  // most `attempts` times) and goes on. Returns the number of failed calls
  // (per worker); a trainer that runs out of attempts stops, failing the
  // test.
  std::vector<int> RunTrainerLoops(int64_t first, int64_t last,
                                   int attempts = 6);
  // Arms `fault` on worker w (replacing any earlier one).
  void SetFault(int w, const Fault& fault);
  // Calls worker w's transports made in the first round of its last
  // armed step (a probe: arm with a call past the end).
  int64_t CallsCounted(int w);
  // The matrices whose updates go back by broadcast under `plan` even
  // where their owners write into the peers' staging: each owner's last
  // stack's, among more than two workers (scheduler::Transfer::by_collective).
  std::set<int> UpdatesByBroadcast(const v1::Plan& plan,
                                   int64_t bucket_bytes = 0) const;
  // Bytes engine w wrote into its peers' staging, and received so.
  double PeerWriteBytes(int w) const;
  double PeerReceivedBytes(int w) const;
  // Expects every trainer's parameters to equal `reference`'s, bit for bit.
  void ExpectParamsMatch(const ReferenceSteps& reference);
  // Steps every engine with a trainer `steps` times and checks their
  // parameters against the CPU kernels in one process, bit for bit.
  void StepAndMatchTheKernelsInOneProcess(int64_t steps);

  // The parameter group (index) AttachRequestOf attaches a matrix in; none
  // for a matrix not named.
  std::map<std::string, int> groups_;
  std::vector<std::unique_ptr<transport::TcpListener>> listeners_;
  std::map<std::string, std::string> addresses_;
  Trainer trainers_[kWorkers];
  std::vector<std::unique_ptr<StepEngine>> engines_;
  // Each engine's peer-write counters (WriteCounters).
  std::vector<std::unique_ptr<MetricsRegistry>> metrics_;
  std::vector<WriteCounters> write_counters_;
  std::vector<std::unique_ptr<FaultState>> faults_;
  std::atomic<bool> following_{false};
  std::atomic<int> followed_steps_{0};
  std::vector<std::thread> followers_;
};

// `Fixture` (a StepEngineTest) with its control messages on a TCP mesh of
// their own, passed along a chain (a control tree of fanout 1: 0 - 1 -
// 2 ...), as a GPU job's pass along a tree past kControlTreeFanout + 1
// workers: each middle rank passes every gather up and every broadcast on.
template <typename Fixture>
class ControlChain : public Fixture {
 protected:
  bool SplitControl() const override { return true; }
  int ControlTreeFanout() const override { return 1; }
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_ENGINE_FIXTURE_H_
