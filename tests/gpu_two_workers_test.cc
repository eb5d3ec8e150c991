// Two workers and two trainers sharing one GPU over the CUDA IPC transport,
// three in two cases and six on two or three nodes summing their unreduced
// gradients in two levels, with real coordinator and worker processes:
// 50-step parity per layout with the same kernels in one process, and a
// worker killed mid-step failing every trainer's step without a hang. The
// "/nccl" cases run the workers over NCCL instead: NCCL refuses two ranks
// of one host on one GPU, so each worker process names a host of its own
// (NCCL_HOSTID) and NCCL joins them through its network transport, sockets
// on loopback, as ranks on different machines.
// Needs a GPU: tagged gpu + manual; run by deploy/device/run_gpu_step_suite.sh.
#include <cuda_runtime.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/dtype.h"
#include "common/row_ranges.h"
#include "gtest/gtest.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "newton_schulz/options.h"
#include "scheduler/node_exchange.h"
#include "scheduler/plan_types.h"
#include "tests/client_options.h"
#include "tests/gpu_test_support.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::BinaryPath;
using testing::ChildProcess;
using testing::GradValue;
using testing::Matrices;
using testing::MatrixCase;
using testing::NewTempDir;
using testing::RelativeError;
constexpr absl::Duration kStartTimeout = testing::kGpuStartTimeout;

// The trainers of a case share this process, each waiting on the GPU for
// its own step on a stream of its own. Under CUDA MPS a client that does
// not ask (CUDA_DEVICE_MAX_CONNECTIONS, read when the process creates its
// context, and inherited by the workers it starts) gets fewer hardware
// queues than the 8 it gets alone: with three trainers or more their
// streams share queues, a trainer's gradient event can wait behind another
// trainer's wait for a step that needs it, and every step stalls until its
// I/O timeout (on one H100, 2026-12-06: three and six workers stalled under
// MPS, and passed asking for 8; six asking for 4 stalled). A trainer in a
// process of its own has one such stream. Asking for 8 changes nothing
// without MPS.
[[maybe_unused]] const bool kQueueEachStream = [] {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8", /*overwrite=*/0);
  return true;
}();

// Two workers and two trainers sharing one GPU over the CUDA IPC transport
// or NCCL ("/nccl"): the trainers (two clients of this process) lend their
// buffers to their own workers; parity per layout with the same kernels in
// one process on the mean or whole gradients.
class TwoWorkersOneGpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no GPU";
    }
    log_dir_ = NewTempDir("gpu_two");
    char socket_dir[] = "/tmp/muonps-g2-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_dir_ = socket_dir;
    // "/groups": the workers say they run on two nodes, linked by a network
    // slow enough that the coordinator plans one owner group per node.
    // "/nodes*": on several nodes whose hops the coordinator weighs as slow
    // (1 ms), so that it sums the unreduced gradients in two levels; for
    // row_sharded ones on a network so slow (1 MB/s) that it relays the
    // rows through the owners' nodes' ports.
    std::vector<std::string> coordinator_flags;
    if (Groups()) coordinator_flags.push_back("--network_gbs=0.001");
    if (!NodeOf().empty()) coordinator_flags.push_back("--network_hop_us=1000");
    if (!NodeOf().empty() && Layout() == scheduler::Layout::kRowSharded) {
      coordinator_flags.push_back("--network_gbs=0.001");
    }
    absl::StatusOr<testing::RunningCoordinator> c = testing::StartCoordinator(
        log_dir_ + "/coordinator.log", kStartTimeout, coordinator_flags);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(c->process);
    address_ = c->address;
    for (int w = 0; w < Workers(); ++w) {
      std::vector<std::string> argv = {
          BinaryPath("server/worker/muonps-worker"),
          "--coordinator=" + address_, "--job=gpu2",
          absl::StrCat("--worker_id=w", w),
          absl::StrCat("--socket=", socket_dir_, "/w", w, ".sock"),
          "--metrics_port=-1", "--device=cuda:0",
          Nccl() ? "--gpu_transport=nccl" : "--gpu_transport=ipc",
          "--io_timeout_ms=10000",
          // Before the votes whatever the plan's clock chose, so the
          // applies before the votes and their undo run here.
          "--apply_early=always",
          Groups()           ? absl::StrCat("--node=node-", w)
          : NodeOf().empty() ? std::string("--node=one")
                             : absl::StrCat("--node=node-", NodeOf()[w])};
      for (const std::string& flag : ExtraWorkerFlags()) argv.push_back(flag);
      absl::StatusOr<std::unique_ptr<ChildProcess>> worker =
          ChildProcess::Start(argv,
                              absl::StrCat(log_dir_, "/worker", w, ".log"),
                              NcclEnvironment(w));
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
    for (auto& w : workers_) {
      ASSERT_TRUE(w->WaitForLog("listening on unix:", kStartTimeout).ok())
          << w->Log();
    }
  }

  // More flags for every worker (a subclass's --test_pause_at).
  virtual std::vector<std::string> ExtraWorkerFlags() const { return {}; }

  // "/nccl": the workers' GPU transport is NCCL.
  bool Nccl() const { return GetParam().find("/nccl") != std::string::npos; }
  // Worker w's environment: in the "/nccl" cases a NCCL host of its own.
  std::vector<std::string> NcclEnvironment(int w) const {
    if (!Nccl()) return {};
    return testing::OwnNcclHostEnvironment(absl::StrCat("gpu2-w", w));
  }
  // Whether NCCL adds a sum of more than two parts in its own order (an
  // unreduced gradient of three trainers, or along a rail of three nodes),
  // which the replay's order need not match bit for bit.
  bool NcclOrdersASum() const {
    if (!Nccl() || Layout() != scheduler::Layout::kUnreduced) return false;
    return nodes_.empty() ? Workers() > 2 : nodes_.size() > 2;
  }

  // In the "/nccl" cases every worker formed its NCCL rank of Workers(),
  // and on several nodes for unreduced gradients its rail's communicator, a
  // rank for each node (rows relayed between them need none).
  void ExpectNcclRanks() {
    if (!Nccl()) return;
    for (size_t w = 0; w < workers_.size(); ++w) {
      EXPECT_TRUE(workers_[w]
                      ->WaitForLog(absl::StrCat("NCCL rank [0-9]+ of ",
                                                Workers(), " on cuda:0"),
                                   absl::Seconds(1))
                      .ok())
          << "worker " << w << " formed no NCCL rank:\n"
          << workers_[w]->Log();
      if (nodes_.empty() || Layout() != scheduler::Layout::kUnreduced) {
        continue;
      }
      EXPECT_TRUE(
          workers_[w]
              ->WaitForLog(absl::StrCat("ncclCommSplit into group [0-9]+ "
                                        "of [0-9]+ of rails \\(",
                                        nodes_.size(), " ranks\\) formed"),
                           absl::Seconds(1))
              .ok())
          << "worker " << w << " formed no rail of " << nodes_.size()
          << " NCCL ranks:\n"
          << workers_[w]->Log();
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      for (auto& w : workers_) std::cerr << "== worker\n" << w->Log();
    }
    clients_.clear();
    for (char* b : blocks_) cudaFree(b);
    workers_.clear();
    coordinator_.reset();
  }

  // The parameter: "<layout>" (fp32 buffers) or "<layout>/bf16", "/nccl"
  // for workers over NCCL (each its own NCCL host), and
  // "/groups" for workers on two nodes (replicated only), "/three" for
  // three workers and trainers (each owner's last stack's updates then go
  // by broadcast beside the others' peer writes: Transfer::by_collective),
  // "/nodes2x3" and "/nodes3x2" for six on two nodes of three or three of
  // two, out of rank order (unreduced: the two-level exchange; row_sharded:
  // rows through relays),
  // "/experts" for a row_sharded stack whose trainers hold whole experts
  // (FSDP2's Shard(0) of a 3-D parameter; the plan owns them where held).
  int Workers() const {
    if (!node_of_.empty()) return static_cast<int>(node_of_.size());
    return GetParam().find("/three") != std::string::npos ? 3 : 2;
  }
  // Each worker's node where the case puts them on several; else empty.
  const std::vector<int>& NodeOf() const { return node_of_; }
  static std::vector<int> NodesOfCase(const std::string& param) {
    if (param.find("/nodes2x3") != std::string::npos) {
      return {0, 0, 0, 1, 1, 1};
    }
    if (param.find("/nodes3x2") != std::string::npos) {
      return {0, 1, 2, 0, 1, 2};
    }
    return {};
  }
  bool Groups() const {
    return GetParam().find("/groups") != std::string::npos;
  }
  bool ShardExperts(const MatrixCase& c) const {
    return c.experts > 1 && Layout() == scheduler::Layout::kRowSharded &&
           GetParam().find("/experts") != std::string::npos;
  }
  std::string LayoutName() const {
    return GetParam().substr(0, GetParam().find('/'));
  }
  DType Dtype() const {
    return GetParam().find("/bf16") != std::string::npos ? DType::kBFloat16
                                                         : DType::kFloat32;
  }
  int64_t Width() const { return static_cast<int64_t>(DTypeSize(Dtype())); }
  scheduler::Layout Layout() const {
    return LayoutName() == "unreduced"     ? scheduler::Layout::kUnreduced
           : LayoutName() == "row_sharded" ? scheduler::Layout::kRowSharded
                                           : scheduler::Layout::kReplicated;
  }

  // What trainer `t` holds of expert `ex` of `c`: every row, its rows
  // (torch.chunk's split), or the whole expert or nothing (whole experts).
  ExpertPart Part(const MatrixCase& c, int64_t ex, int t) const {
    if (Layout() != scheduler::Layout::kRowSharded) {
      return {.row_begin = 0, .row_end = c.rows, .first_row = ex * c.rows};
    }
    return ShardPartOfExpert(c.rows, c.experts, ShardExperts(c), ex, t,
                             Workers());
  }
  // The elements trainer `t` lends of `c`.
  int64_t Held(const MatrixCase& c, int t) const {
    int64_t rows = 0;
    for (int64_t ex = 0; ex < c.experts; ++ex) rows += Part(c, ex, t).rows();
    return rows * c.cols;
  }
  // Trainer `t`'s part of `whole` (every expert's elements of `c`, expert
  // after expert), laid out as it lends it.
  std::vector<float> HeldOf(const std::vector<float>& whole,
                            const MatrixCase& c, int t) const {
    std::vector<float> out(Held(c, t));
    for (int64_t ex = 0; ex < c.experts; ++ex) {
      const ExpertPart part = Part(c, ex, t);
      std::copy_n(whole.begin() + (ex * c.rows + part.row_begin) * c.cols,
                  part.rows() * c.cols, out.begin() + part.first_row * c.cols);
    }
    return out;
  }

  // Starts both trainers (threads: each Start waits for the other's worker).
  // Each has a stream of its own, as separate trainer processes would: on
  // one shared stream the second trainer's ready event would queue behind
  // the first one's wait for its step, which needs the second's gradients.
  void StartTrainers() {
    streams_.assign(Workers(), nullptr);
    for (cudaStream_t& s : streams_) {
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                cudaSuccess);
    }
    clients_.resize(Workers());
    grads_.assign(Workers(), {});
    params_.assign(Workers(), {});
    std::vector<absl::Status> started(Workers());
    std::vector<std::thread> threads;
    for (int t = 0; t < Workers(); ++t) {
      absl::StatusOr<std::unique_ptr<Client>> created = Client::Create(
          {.coordinator = address_,
           .job = "gpu2",
           .worker_socket = absl::StrCat(socket_dir_, "/w", t, ".sock"),
           .trainer_rank = t,
           .trainer_count = Workers(),
           .device = "cuda:0"});
      ASSERT_TRUE(created.ok()) << created.status();
      clients_[t] = *std::move(created);
      for (size_t m = 0; m < Matrices().size(); ++m) {
        const MatrixCase& c = Matrices()[m];
        ASSERT_TRUE(clients_[t]
                        ->AddMatrix(c.name, c.rows, c.cols,
                                    {.layout = testing::ClientLayout(Layout()),
                                     .layer = static_cast<int32_t>(m),
                                     .experts = c.experts,
                                     .shard_experts = ShardExperts(c)})
                        .ok());
        // At least one element: a trainer may hold none of the experts.
        const int64_t n = std::max<int64_t>(Held(c, t), 1);
        char* block = nullptr;
        ASSERT_EQ(cudaMalloc(&block, 2 * n * Width()), cudaSuccess);
        blocks_.push_back(block);
        std::vector<float> whole(c.rows * c.cols * c.experts);
        for (int64_t i = 0; i < static_cast<int64_t>(whole.size()); ++i) {
          whole[i] = InitialParam(m, i);
        }
        char* param = block + n * Width();
        const absl::Status up =
            testing::UploadAs(Dtype(), HeldOf(whole, c, t), param);
        ASSERT_TRUE(up.ok()) << up;
        grads_[t].push_back(block);
        params_[t].push_back(param);
        ASSERT_TRUE(
            clients_[t]
                ->LendCuda(c.name, block, param, testing::ClientDType(Dtype()))
                .ok());
      }
    }
    MuonOptions muon;
    muon.lr = 0.02;
    muon.weight_decay = 0.1;
    for (int t = 0; t < Workers(); ++t) {
      threads.emplace_back(
          [&, t] { started[t] = clients_[t]->Start(muon, AdamWOptions()); });
    }
    for (auto& th : threads) th.join();
    for (const absl::Status& s : started) ASSERT_TRUE(s.ok()) << s;
    if (std::any_of(Matrices().begin(), Matrices().end(),
                    [&](const MatrixCase& c) { return ShardExperts(c); })) {
      ASSERT_NO_FATAL_FAILURE(WaitForTheWholeExpertPlan());
    }
    if (!NodeOf().empty()) {
      ASSERT_NO_FATAL_FAILURE(ReadExchangeNodes());
    }
  }

  // The plan's exchange nodes (GetPlan, as grpcurl reads it), by trainer
  // (worker "w<t>" serves trainer t): one per node of NodeOf(), each of
  // that node's workers, in the positions the replay adds them in.
  void ReadExchangeNodes() {
    std::unique_ptr<v1::Coordinator::Stub> stub =
        v1::Coordinator::NewStub(testing::TestChannel(address_));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::GetPlanRequest request;
    request.set_job("gpu2");
    v1::Plan plan;
    const grpc::Status got = stub->GetPlan(&context, request, &plan);
    ASSERT_TRUE(got.ok()) << got.error_message();
    const std::vector<int>& node_of = NodeOf();
    ASSERT_EQ(plan.exchange_nodes_size(),
              *std::max_element(node_of.begin(), node_of.end()) + 1)
        << plan.DebugString();
    nodes_.clear();
    for (const v1::NodeWorkers& node : plan.exchange_nodes()) {
      std::vector<int32_t>& trainers = nodes_.emplace_back();
      for (const std::string& id : node.workers()) {
        int32_t t = -1;
        ASSERT_TRUE(id.size() > 1 && absl::SimpleAtoi(id.substr(1), &t)) << id;
        ASSERT_TRUE(t >= 0 && t < Workers()) << id;
        trainers.push_back(t);
        EXPECT_EQ(node_of[t], node_of[trainers[0]]) << plan.DebugString();
      }
    }
  }

  // The coordinator plans again once every trainer's rank is known (its
  // whole experts owned where they are held), a heartbeat after the
  // trainers start: stepping before every worker follows that plan, a step
  // would meet the change and fail, so the tests wait for it.
  void WaitForTheWholeExpertPlan() {
    absl::StatusOr<std::string> version = coordinator_->WaitForLog(
        "plan version ([0-9]+): whole experts", absl::Seconds(30));
    ASSERT_TRUE(version.ok()) << version.status();
    for (auto& w : workers_) {
      ASSERT_TRUE(
          w->WaitForLog(absl::StrCat("plan_version=", *version, " rank="),
                        absl::Seconds(30))
              .ok())
          << w->Log();
    }
  }

  static float InitialParam(size_t m, int64_t i) {
    return 0.02f * std::sin(0.1f * static_cast<float>(i) + m);
  }

  // The gradient trainer `t` holds of matrix `m` (whole-matrix index `i`).
  float Grad(int64_t step, size_t m, int t, int64_t i) const {
    const int source = Layout() == scheduler::Layout::kUnreduced ? t : 0;
    return GradValue(step * Workers() + source, static_cast<int>(m), i);
  }

  // Matrix m's gradient as the owner uses it: the mean of the trainers'
  // (unreduced), as the workers take it (the fp32 sum of the parts as lent,
  // in trainer order or as the exchange adds them over its nodes, times the
  // fp32 inverse), or trainer 0's as lent.
  float WholeGradient(int64_t step, size_t m, int64_t i) const {
    const auto lent = [&](int32_t t) {
      return testing::AsLent(Dtype(), Grad(step, m, t, i));
    };
    if (Layout() != scheduler::Layout::kUnreduced) return lent(0);
    float sum = 0;
    if (!nodes_.empty()) {
      sum = scheduler::SumOverNodes(nodes_, lent);
    } else {
      for (int t = 0; t < Workers(); ++t) sum += lent(t);
    }
    return sum * (1.0f / static_cast<float>(Workers()));
  }

  // Trainer t's parameter of matrix m as its next kernels see it: after
  // its stream's wait for the worker's done counter (the worker answers
  // with the step's writes, or a refused step's undo, still in flight on
  // its own stream).
  absl::StatusOr<std::vector<float>> LentParam(int t, size_t m) const {
    if (cudaStreamSynchronize(streams_[t]) != cudaSuccess) {
      return absl::InternalError("the trainer's stream failed");
    }
    return testing::DownloadAs(Dtype(), params_[t][m], Held(Matrices()[m], t));
  }

  void WriteGradients(int64_t step) {
    for (int t = 0; t < Workers(); ++t) {
      for (size_t m = 0; m < Matrices().size(); ++m) {
        const MatrixCase& c = Matrices()[m];
        std::vector<float> whole(c.rows * c.cols * c.experts);
        for (int64_t i = 0; i < static_cast<int64_t>(whole.size()); ++i) {
          whole[i] = Grad(step, m, t, i);
        }
        const absl::Status up =
            testing::UploadAs(Dtype(), HeldOf(whole, c, t), grads_[t][m]);
        ASSERT_TRUE(up.ok()) << up;
      }
    }
  }

  std::string log_dir_, socket_dir_, address_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<char*> blocks_;
  std::vector<std::vector<char*>> grads_, params_;  // by trainer, matrix
  std::vector<cudaStream_t> streams_;               // by trainer
  // Read once: Workers() is asked for every gradient element.
  const std::vector<int> node_of_ = NodesOfCase(GetParam());
  // The plan's exchange nodes by trainer (ReadExchangeNodes); empty where
  // the case has one node.
  std::vector<std::vector<int32_t>> nodes_;
};

TEST_P(TwoWorkersOneGpuTest, FiftyStepsMatchTheSameKernelsInOneProcess) {
  ASSERT_NO_FATAL_FAILURE(StartTrainers());
  absl::StatusOr<std::map<std::string, NsAlgorithm>> algorithms =
      testing::NsAlgorithmsOf(clients_[0]->NsAlgorithms());
  ASSERT_TRUE(algorithms.ok()) << algorithms.status();
  constexpr int kSteps = 50;
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_NO_FATAL_FAILURE(WriteGradients(step));
    for (int t = 0; t < Workers(); ++t) {
      absl::StatusOr<StepResult> r =
          clients_[t]->Step(step, {.stream = streams_[t], .async = true});
      ASSERT_TRUE(r.ok()) << r.status();
    }
    for (int t = 0; t < Workers(); ++t) {
      absl::StatusOr<StepResult> r = clients_[t]->Wait();
      ASSERT_TRUE(r.ok()) << "step " << step << " trainer " << t << ": "
                          << r.status();
    }
  }
  // The same kernels in this process, on the mean (unreduced) or the one
  // gradient as lent (rounded to bf16 for bf16 buffers); the gradients are
  // functions of the step, so the reference runs after the trainers' steps.
  absl::StatusOr<std::vector<std::vector<float>>> wanted =
      testing::ReferenceParams(Dtype(), kSteps, *algorithms, InitialParam,
                               [&](int64_t step, size_t m, int64_t i) {
                                 return WholeGradient(step, m, i);
                               });
  ASSERT_TRUE(wanted.ok()) << wanted.status();
  if (Groups()) {
    // Each worker owned every matrix in its own group: nothing moved.
    EXPECT_TRUE(
        coordinator_
            ->WaitForLog("owner groups taken: 2 of 1 workers", absl::Seconds(1))
            .ok())
        << coordinator_->Log();
  }
  double worst = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    for (int t = 0; t < Workers(); ++t) {
      absl::StatusOr<std::vector<float>> lent = LentParam(t, m);
      ASSERT_TRUE(lent.ok()) << lent.status();
      const double err = RelativeError(*lent, HeldOf((*wanted)[m], c, t));
      worst = std::max(worst, err);
      EXPECT_LE(err, 5e-3) << c.name << " trainer " << t;
    }
  }
  ExpectNcclRanks();
  if ((Nccl() || !nodes_.empty()) && !NcclOrdersASum()) {
    // Summed as the replay sums them (NCCL adds in an order of its own, but
    // no sum here has more than two parts, which every order adds alike):
    // the same bits.
    EXPECT_EQ(worst, 0) << "against the same kernels in one process";
  }
  if (!nodes_.empty()) {
    EXPECT_TRUE(coordinator_
                    ->WaitForLog("unreduced gradients summed in two levels",
                                 absl::Seconds(1))
                    .ok())
        << coordinator_->Log();
  }
  if (std::any_of(Matrices().begin(), Matrices().end(),
                  [&](const MatrixCase& c) { return ShardExperts(c); })) {
    // Planned again once every trainer's rank was known, with the trainers'
    // shards (common/row_ranges.h): the coordinator says how it owns them.
    EXPECT_TRUE(
        coordinator_->WaitForLog("whole experts", absl::Seconds(1)).ok())
        << coordinator_->Log();
  }
  std::printf(
      "{\"what\":\"gpu_two_workers_parity\",\"case\":\"%s\","
      "\"layout\":\"%s\","
      "\"dtype\":\"%s\",\"workers\":%d,\"transport\":\"%s\","
      "\"steps\":%d,\"max_rel_err\":%g}\n",
      GetParam().c_str(), LayoutName().c_str(),
      std::string(DTypeName(Dtype())).c_str(), Workers(),
      Nccl() ? "nccl" : "ipc", kSteps, worst);
}

// A step refused at the votes (a non-finite gradient of one matrix) after
// the workers that did not read it applied what their streams order
// (EarlyApply::kUndoable): every trainer's parameters are back bit for bit,
// and the retry with clean gradients applies the step once.
TEST_P(TwoWorkersOneGpuTest, ARefusedStepLeavesEveryParameterAsItWas) {
  ASSERT_NO_FATAL_FAILURE(StartTrainers());
  absl::StatusOr<std::map<std::string, NsAlgorithm>> algorithms =
      testing::NsAlgorithmsOf(clients_[0]->NsAlgorithms());
  ASSERT_TRUE(algorithms.ok()) << algorithms.status();
  const auto step_all = [&](int64_t step) {
    std::vector<absl::Status> out;
    for (int t = 0; t < Workers(); ++t) {
      absl::StatusOr<StepResult> r =
          clients_[t]->Step(step, {.stream = streams_[t], .async = true});
      EXPECT_TRUE(r.ok()) << r.status();
    }
    for (int t = 0; t < Workers(); ++t)
      out.push_back(clients_[t]->Wait().status());
    return out;
  };
  const auto params = [&]() {
    std::vector<std::vector<float>> out;
    for (int t = 0; t < Workers(); ++t) {
      for (size_t m = 0; m < Matrices().size(); ++m) {
        absl::StatusOr<std::vector<float>> lent = LentParam(t, m);
        EXPECT_TRUE(lent.ok()) << lent.status();
        out.push_back(lent.ok() ? *std::move(lent) : std::vector<float>());
      }
    }
    return out;
  };
  constexpr int64_t kSteps = 4, kRefused = 2;
  bool left_unchanged = false;
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_NO_FATAL_FAILURE(WriteGradients(step));
    if (step == kRefused) {
      const std::vector<std::vector<float>> before = params();
      // On every trainer: whichever copy the owner reads (replicated: its
      // own trainer's) has it.
      const MatrixCase& c = Matrices()[0];
      for (int t = 0; t < Workers(); ++t) {
        std::vector<float> bad(Held(c, t), 0.5f);
        bad[bad.size() / 2] = std::numeric_limits<float>::quiet_NaN();
        ASSERT_TRUE(testing::UploadAs(Dtype(), bad, grads_[t][0]).ok());
      }
      for (const absl::Status& s : step_all(step)) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      }
      left_unchanged = params() == before;
      EXPECT_TRUE(left_unchanged) << "a refused step left parameters changed";
      ASSERT_NO_FATAL_FAILURE(WriteGradients(step));
    }
    for (const absl::Status& s : step_all(step)) {
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
    }
  }
  absl::StatusOr<std::vector<std::vector<float>>> wanted =
      testing::ReferenceParams(Dtype(), kSteps, *algorithms, InitialParam,
                               [&](int64_t step, size_t m, int64_t i) {
                                 return WholeGradient(step, m, i);
                               });
  ASSERT_TRUE(wanted.ok()) << wanted.status();
  double worst = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    for (int t = 0; t < Workers(); ++t) {
      absl::StatusOr<std::vector<float>> lent = LentParam(t, m);
      ASSERT_TRUE(lent.ok()) << lent.status();
      worst = std::max(worst, RelativeError(*lent, HeldOf((*wanted)[m], c, t)));
    }
  }
  if (NcclOrdersASum()) {
    EXPECT_LE(worst, 5e-3) << "against the same kernels in one process";
  } else {
    EXPECT_EQ(worst, 0) << "against the same kernels in one process";
  }
  std::printf(
      "{\"what\":\"gpu_two_workers_refused_step\",\"case\":\"%s\","
      "\"layout\":\"%s\","
      "\"dtype\":\"%s\",\"workers\":%d,\"steps\":%lld,"
      "\"refused_step_left_parameters\":\"%s\",\"max_rel_err\":%g}\n",
      GetParam().c_str(), LayoutName().c_str(),
      std::string(DTypeName(Dtype())).c_str(), Workers(),
      static_cast<long long>(kSteps), left_unchanged ? "unchanged" : "changed",
      worst);
}

TEST_P(TwoWorkersOneGpuTest, KilledWorkerFailsEveryTrainersStepWithoutAHang) {
  if (GetParam() != "unreduced/bf16" &&
      GetParam() != "unreduced/bf16/nodes3x2" &&
      GetParam() != "unreduced/bf16/nccl" &&
      GetParam() != "unreduced/nodes2x3/nccl" &&
      GetParam() != "row_sharded/bf16/nodes3x2/nccl") {
    GTEST_SKIP() << "two cases a transport are enough";
  }
  ASSERT_NO_FATAL_FAILURE(StartTrainers());
  ASSERT_NO_FATAL_FAILURE(WriteGradients(0));
  for (int t = 0; t < Workers(); ++t) {
    ASSERT_TRUE(
        clients_[t]->Step(0, {.stream = streams_[t], .async = true}).ok());
  }
  for (int t = 0; t < Workers(); ++t) ASSERT_TRUE(clients_[t]->Wait().ok());
  ASSERT_NO_FATAL_FAILURE(WriteGradients(1));
  const absl::Time start = absl::Now();
  for (int t = 0; t < Workers(); ++t) {
    ASSERT_TRUE(
        clients_[t]->Step(1, {.stream = streams_[t], .async = true}).ok());
  }
  workers_[1]->Signal(SIGKILL);  // mid-step
  for (int t = 0; t < Workers(); ++t) {
    absl::StatusOr<StepResult> r = clients_[t]->Wait();
    EXPECT_FALSE(r.ok()) << "trainer " << t;
    std::printf("trainer %d: %s\n", t, r.status().ToString().c_str());
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // The trainers' streams were released: their memory is usable.
  std::vector<float> p(16);
  EXPECT_EQ(cudaMemcpy(p.data(), params_[0][0], 64, cudaMemcpyDeviceToHost),
            cudaSuccess);
}

// A writer stopped before any of its copies (SIGSTOP on the host, at the
// step's first transfer, as a frozen or dying process stops): the others
// have enqueued, on their compute streams, waits for its landing words
// behind their own early applies (staging_windows.h). Their steps fail
// within the io timeout, the undo releases those waits, and their
// trainers' parameters are as before the step, bit for bit; then the
// stopped writer is killed and its trainer's step fails too.
class PausedWriterOneGpuTest : public TwoWorkersOneGpuTest {
 protected:
  std::vector<std::string> ExtraWorkerFlags() const override {
    return {"--test_pause_at=transfer@1@rank1"};
  }
};

TEST_P(PausedWriterOneGpuTest, OthersReleaseTheirWaitsForItsLandingWords) {
  ASSERT_NO_FATAL_FAILURE(StartTrainers());
  ASSERT_NO_FATAL_FAILURE(WriteGradients(0));
  for (int t = 0; t < Workers(); ++t) {
    ASSERT_TRUE(
        clients_[t]->Step(0, {.stream = streams_[t], .async = true}).ok());
  }
  for (int t = 0; t < Workers(); ++t) ASSERT_TRUE(clients_[t]->Wait().ok());
  std::vector<std::vector<std::vector<float>>> before(Workers());
  for (int t = 0; t < Workers(); ++t) {
    for (size_t m = 0; m < Matrices().size(); ++m) {
      absl::StatusOr<std::vector<float>> p = LentParam(t, m);
      ASSERT_TRUE(p.ok()) << p.status();
      before[t].push_back(*std::move(p));
    }
  }
  ASSERT_NO_FATAL_FAILURE(WriteGradients(1));
  const absl::Time start = absl::Now();
  for (int t = 0; t < Workers(); ++t) {
    ASSERT_TRUE(
        clients_[t]->Step(1, {.stream = streams_[t], .async = true}).ok());
  }
  int paused = -1;
  while (paused < 0 && absl::Now() - start < absl::Seconds(30)) {
    for (int w = 0; w < Workers(); ++w) {
      if (workers_[w]->Log().find("paused at transfer") != std::string::npos) {
        paused = w;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(paused, 0) << "no worker paused at step 1's first transfer";
  bool left_unchanged = true;
  for (int t = 0; t < Workers(); ++t) {
    if (t == paused) continue;  // its worker serves trainer t
    absl::StatusOr<StepResult> r = clients_[t]->Wait();
    EXPECT_FALSE(r.ok()) << "trainer " << t;
    std::printf("trainer %d: %s\n", t, r.status().ToString().c_str());
    for (size_t m = 0; m < Matrices().size(); ++m) {
      absl::StatusOr<std::vector<float>> p = LentParam(t, m);
      ASSERT_TRUE(p.ok()) << p.status();
      left_unchanged = left_unchanged && *p == before[t][m];
      EXPECT_EQ(*p, before[t][m]) << Matrices()[m].name << " of trainer " << t
                                  << " changed by a step that failed";
    }
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(40));
  // The peers' copies had been waited for on the device, and released.
  // (Two workers: the survivor's stage ends, with nothing to send the
  // paused one, and its step fails at the votes; with three, a broadcast
  // of the paused one's may fail the stage before its waits are enqueued.)
  int released = 0;
  for (int w = 0; w < Workers(); ++w) {
    if (w != paused &&
        workers_[w]->Log().find("step 1: released the waits for") !=
            std::string::npos) {
      ++released;
    }
  }
  if (Workers() == 2) {
    EXPECT_EQ(released, 1) << "the survivor did not wait for the paused "
                              "writer's landing words";
  }
  workers_[paused]->Signal(SIGKILL);
  EXPECT_FALSE(clients_[paused]->Wait().ok());
  // Every worker's streams were released: theirs and the trainers' memory
  // is usable.
  for (int t = 0; t < Workers(); ++t) {
    if (t == paused) continue;
    EXPECT_TRUE(workers_[t]->running()) << "worker " << t;
  }
  std::printf(
      "{\"what\":\"gpu_two_workers_paused_writer\",\"case\":\"%s\","
      "\"workers\":%d,\"released_waits\":%d,"
      "\"failed_step_left_parameters\":\"%s\",\"seconds\":%.1f}\n",
      GetParam().c_str(), Workers(), released,
      left_unchanged ? "unchanged" : "changed",
      absl::ToDoubleSeconds(absl::Now() - start));
}

INSTANTIATE_TEST_SUITE_P(OneGpu, PausedWriterOneGpuTest,
                         ::testing::Values("replicated",
                                           "replicated/bf16/three",
                                           "replicated/bf16/three/nccl"));

INSTANTIATE_TEST_SUITE_P(
    OneGpu, TwoWorkersOneGpuTest,
    ::testing::Values(
        "replicated", "unreduced", "row_sharded", "replicated/bf16",
        "unreduced/bf16", "row_sharded/bf16", "replicated/groups",
        "replicated/bf16/groups", "replicated/bf16/three",
        "unreduced/bf16/three", "row_sharded/experts",
        "row_sharded/bf16/experts/three", "unreduced/nodes2x3",
        "unreduced/bf16/nodes3x2", "replicated/nccl", "unreduced/nccl",
        "unreduced/bf16/nccl", "row_sharded/bf16/nccl",
        "replicated/bf16/groups/nccl", "replicated/bf16/three/nccl",
        "row_sharded/bf16/experts/three/nccl", "unreduced/nodes2x3/nccl",
        "unreduced/bf16/three/nccl", "unreduced/bf16/nodes3x2/nccl",
        "row_sharded/nodes2x3", "row_sharded/bf16/nodes3x2/nccl",
        "row_sharded/nodes2x3/nccl"));

}  // namespace
}  // namespace muonps
