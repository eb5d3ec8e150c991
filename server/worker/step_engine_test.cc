// Three StepEngines in one process, each with its "trainer" in host memory,
// over loopback TCP transports: the worker's data path without processes
// or a coordinator. Proves the renovated step path: every layout reaches
// the single-process result of the same kernels (bit for bit: the mean is
// summed in trainer order), a non-finite gradient on one trainer rejects
// the step on all three with nothing changed, a retried step id is a
// no-op, and a new plan version keeps the momentum of items whose owner
// did not change (and counts the ones that start over).
#include "server/worker/step_engine.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "transport/loopback_ranks.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace worker {
namespace {

constexpr int kWorkers = 3;

struct MatrixDecl {
  std::string name;
  int64_t rows, cols;
  v1::Layout layout;
};

// Same-shape pairs (one stack per owner), all three layouts.
const std::vector<MatrixDecl>& Matrices() {
  static const auto* m = new std::vector<MatrixDecl>{
      {"rep.a", 24, 40, v1::LAYOUT_REPLICATED},
      {"rep.b", 24, 40, v1::LAYOUT_REPLICATED},
      {"unr.a", 32, 16, v1::LAYOUT_UNREDUCED},
      {"unr.b", 20, 20, v1::LAYOUT_UNREDUCED},
      {"row.a", 30, 12, v1::LAYOUT_ROW_SHARDED},
  };
  return *m;
}

float GradValue(int64_t step, int matrix, int trainer, int64_t i) {
  return std::sin(0.37f * static_cast<float>(i + 1) + 1.3f * matrix +
                  0.7f * step + 0.11f * trainer);
}

// A trainer's lent memory: plain vectors, found by tensor name.
class HostBuffers final : public TrainerBuffers {
 public:
  HostBuffers(std::map<std::string, LentTensor> tensors,
              const absl::Status* intact)
      : tensors_(std::move(tensors)), intact_(intact) {}
  Device device() const override { return kHostDevice; }
  absl::Status CheckIntact() const override { return *intact_; }
  absl::StatusOr<LentTensor> Map(const v1::TensorBinding& t, int64_t,
                                 int64_t) override {
    auto it = tensors_.find(t.name());
    if (it == tensors_.end()) return absl::NotFoundError(t.name());
    return it->second;
  }

 private:
  std::map<std::string, LentTensor> tensors_;
  const absl::Status* intact_;  // the trainer's
};

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
  std::map<std::string, std::vector<uint16_t>> grad16, param16;
};

// The job's hyperparameters as the workers run them.
kernels::MuonHyperparameters MuonFromJob() {
  kernels::MuonHyperparameters h;
  h.lr = 0.02;
  h.weight_decay = 0.1;
  return h;
}

v1::JobSpec Job(int dedicated = 0) {
  v1::JobSpec job;
  job.set_dedicated_workers(dedicated);
  job.set_name("engine-test");
  for (const MatrixDecl& d : Matrices()) {
    v1::Matrix* m = job.add_matrices();
    m->set_name(d.name);
    m->set_rows(d.rows);
    m->set_cols(d.cols);
    m->set_layout(d.layout);
  }
  job.mutable_muon()->set_lr(0.02);
  job.mutable_muon()->set_weight_decay(0.1);
  return job;
}

// Matrix m is owned by worker owners[m], of `workers` ("w0".."wN"; the
// last `dedicated` of them have no trainer).
v1::Plan PlanWithOwnerList(int64_t version, const std::vector<int>& owners,
                           int workers = kWorkers, int dedicated = 0) {
  v1::Plan plan;
  plan.set_version(version);
  for (int w = 0; w < workers; ++w) plan.add_workers(absl::StrCat("w", w));
  plan.set_dedicated_workers(dedicated);
  for (size_t m = 0; m < Matrices().size(); ++m) {
    v1::MatrixPlacement* p = plan.add_matrices();
    p->set_name(Matrices()[m].name);
    p->add_owners(absl::StrCat("w", owners[m]));
  }
  return plan;
}

// Matrix m is owned by worker (m + shift) % kWorkers.
v1::Plan PlanWithOwners(int64_t version, int shift) {
  std::vector<int> owners;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    owners.push_back(static_cast<int>((m + shift) % kWorkers));
  }
  return PlanWithOwnerList(version, owners);
}

class StepEngineTest : public ::testing::Test {
 protected:
  // Workers with no trainer, ranked after the kWorkers with one.
  virtual int Dedicated() const { return 0; }

  void SetUp() override {
    const int total = kWorkers + Dedicated();
    absl::StatusOr<std::vector<std::unique_ptr<transport::TcpListener>>> l =
        transport::BindLoopbackListeners(total);
    ASSERT_TRUE(l.ok()) << l.status();
    listeners_ = *std::move(l);
    const std::vector<std::string> addresses =
        transport::AddressesOf(listeners_);
    engines_.resize(total);
    for (int w = 0; w < total; ++w) {
      addresses_[absl::StrCat("w", w)] = addresses[w];
      if (w >= kWorkers) {
        engines_[w] = std::make_unique<StepEngine>(
            absl::StrCat("w", w), CpuStepBackend(absl::Seconds(10)),
            Connector(listeners_[w].get()));
        continue;
      }
      trainers_[w].rank = w;
      for (const MatrixDecl& d : Matrices()) {
        int64_t n = d.rows * d.cols;
        if (d.layout == v1::LAYOUT_ROW_SHARDED) {
          n = (d.rows * (w + 1) / kWorkers - d.rows * w / kWorkers) * d.cols;
        }
        trainers_[w].grad[d.name].assign(n, 0.0f);
        trainers_[w].param[d.name].assign(n, 0.5f);
      }
      transport::TcpListener* listener = listeners_[w].get();
      StepBackend backend = CpuStepBackend(absl::Seconds(10));
      Trainer* trainer = &trainers_[w];
      backend.open_buffers = [trainer](const v1::AttachRequest&)
          -> absl::StatusOr<std::unique_ptr<TrainerBuffers>> {
        std::map<std::string, LentTensor> lent;
        lent["bias"] = {trainer->bias_grad.data(), trainer->bias.data()};
        for (auto& [name, g] : trainer->grad) {
          lent[name] = {g.data(), trainer->param[name].data()};
          if (trainer->bf16) {
            lent[name] = {trainer->grad16[name].data(),
                          trainer->param16[name].data(), DType::kBFloat16};
          }
        }
        return std::unique_ptr<TrainerBuffers>(
            new HostBuffers(lent, &trainer->intact));
      };
      engines_[w] = std::make_unique<StepEngine>(
          absl::StrCat("w", w), std::move(backend), Connector(listener));
    }
    for (auto& engine : engines_) {
      engine->SetDataPlaneSecret(transport::kLoopbackSecret);
    }
  }

  void TearDown() override {
    following_.store(false);
    for (std::thread& t : followers_) t.join();
  }

  // Builds TCP transports with the secret the engine hands over (the one
  // SetUp gives every engine, as the worker's agent does on joining).
  static TransportFactory Connector(transport::TcpListener* listener) {
    return [listener](int rank, const std::vector<std::string>& peers,
                      uint64_t session, const std::string& secret)
               -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
      transport::TcpOptions options;
      options.data_plane_secret = secret;
      options.io_timeout = absl::Seconds(10);
      options.connect_timeout = absl::Seconds(10);
      auto t = transport::TcpTransport::Connect(listener, rank, peers, session,
                                                options);
      if (!t.ok()) return t.status();
      return std::unique_ptr<transport::Transport>(*std::move(t));
    };
  }

  // The dedicated engines step whenever the others do, as the worker
  // daemon's follow thread runs them.
  void StartFollowing() {
    following_.store(true);
    for (int w = kWorkers; w < kWorkers + Dedicated(); ++w) {
      followers_.emplace_back([this, w] {
        while (following_.load()) {
          absl::StatusOr<std::optional<v1::StepResponse>> step =
              engines_[w]->FollowStep(absl::Milliseconds(50));
          if (step.ok() && step->has_value()) followed_steps_.fetch_add(1);
        }
      });
    }
  }

  void SetPlanEverywhere(const v1::Plan& plan) {
    for (auto& e : engines_) {
      ASSERT_TRUE(e->SetPlan(Job(Dedicated()), plan, addresses_).ok());
    }
  }

  // Every trainer lends bf16 buffers (params 0.5, as the fp32 ones).
  void UseBf16Everywhere() {
    for (Trainer& t : trainers_) {
      t.bf16 = true;
      for (auto& [name, g] : t.grad) {
        t.grad16[name].assign(g.size(), 0);
        t.param16[name].assign(g.size(), FloatToBFloat16(0.5f));
      }
    }
  }

  void AttachEverywhere(int64_t trainer_pid = 0, bool with_bias = false) {
    for (int w = 0; w < kWorkers; ++w) {
      v1::AttachRequest request;
      if (with_bias) {
        v1::TensorBinding* b = request.add_tensors();
        b->set_name("bias");
        b->set_muon(false);
        b->set_layout(v1::LAYOUT_UNREDUCED);
        b->set_elements(7);
      }
      request.set_trainer_pid(trainer_pid);
      request.set_trainer_rank(w);
      request.set_trainer_count(kWorkers);
      for (const MatrixDecl& d : Matrices()) {
        v1::TensorBinding* b = request.add_tensors();
        b->set_name(d.name);
        b->set_muon(true);
        b->set_dtype(trainers_[w].bf16 ? v1::DTYPE_BF16 : v1::DTYPE_FP32);
        b->set_elements(static_cast<int64_t>(trainers_[w].grad[d.name].size()));
      }
      absl::StatusOr<v1::AttachResponse> attached =
          engines_[w]->Attach(request);
      ASSERT_TRUE(attached.ok()) << attached.status();
    }
  }

  void WriteGradients(int64_t step) {
    for (int w = 0; w < kWorkers; ++w) {
      for (int i = 0; i < 7; ++i) {
        trainers_[w].bias_grad[i] = GradValue(step, 99, w, i);
      }
      for (size_t m = 0; m < Matrices().size(); ++m) {
        const MatrixDecl& d = Matrices()[m];
        std::vector<float>& g = trainers_[w].grad[d.name];
        const int64_t first = d.layout == v1::LAYOUT_ROW_SHARDED
                                  ? d.rows * w / kWorkers * d.cols
                                  : 0;
        const int source = d.layout == v1::LAYOUT_UNREDUCED ? w : 0;
        for (size_t i = 0; i < g.size(); ++i) {
          g[i] = GradValue(step, static_cast<int>(m), source, first + i);
        }
        if (trainers_[w].bf16) {
          FromFloat(DType::kBFloat16, g.data(), g.size(),
                    trainers_[w].grad16[d.name].data());
        }
      }
    }
  }

  // Every engine steps `step` at once; the statuses by worker. `edit`
  // changes worker w's request first.
  std::vector<absl::StatusOr<v1::StepResponse>> StepEverywhere(
      int64_t step,
      const std::function<void(int, v1::StepRequest*)>& edit = nullptr) {
    std::vector<absl::StatusOr<v1::StepResponse>> out(
        kWorkers, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back([&, w] {
        v1::StepRequest request;
        request.set_step_id(step);
        request.set_lr(-1);
        request.set_weight_decay(-1);
        if (edit) edit(w, &request);
        out[w] = engines_[w]->Step(request);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // Matrix m's whole gradient of `step` as the owner uses it: the
  // trainers' mean summed in trainer order (unreduced), else trainer 0's;
  // `bf16`: each part as lent in bf16, widened.
  static std::vector<float> WholeGradient(int64_t step, int m, bool bf16) {
    const MatrixDecl& d = Matrices()[m];
    std::vector<float> g(d.rows * d.cols, 0.0f);
    const int sources = d.layout == v1::LAYOUT_UNREDUCED ? kWorkers : 1;
    for (int s = 0; s < sources; ++s) {
      for (size_t i = 0; i < g.size(); ++i) {
        const float v = GradValue(step, m, s, i);
        g[i] += bf16 ? BFloat16ToFloat(FloatToBFloat16(v)) : v;
      }
    }
    if (sources > 1) {
      for (float& v : g) v *= 1.0f / static_cast<float>(sources);
    }
    return g;
  }

  // Steps every engine with a trainer `steps` times and checks their
  // parameters against the CPU kernels in one process, bit for bit.
  void StepAndMatchTheKernelsInOneProcess(int64_t steps) {
    kernels::CpuKernels reference_kernels(kernels::CpuKernelOptions{});
    std::map<std::string, std::vector<float>> param, momentum;
    for (const MatrixDecl& d : Matrices()) {
      param[d.name].assign(d.rows * d.cols, 0.5f);
      momentum[d.name].assign(d.rows * d.cols, 0.0f);
    }
    const kernels::MuonHyperparameters h = MuonFromJob();
    for (int64_t step = 0; step < steps; ++step) {
      WriteGradients(step);
      for (const absl::StatusOr<v1::StepResponse>& r : StepEverywhere(step)) {
        ASSERT_TRUE(r.ok()) << r.status();
      }
      for (size_t m = 0; m < Matrices().size(); ++m) {
        const MatrixDecl& d = Matrices()[m];
        std::vector<float> g = WholeGradient(step, static_cast<int>(m), false);
        kernels::MuonStack stack;
        stack.names = {d.name};
        stack.grad = {g.data(), 1, d.rows, d.cols};
        stack.momentum = {momentum[d.name].data(), 1, d.rows, d.cols};
        stack.param = {param[d.name].data(), 1, d.rows, d.cols};
        ASSERT_TRUE(reference_kernels.MuonStep(stack, h, kHostStream).ok());
      }
    }
    for (int w = 0; w < kWorkers; ++w) {
      for (const MatrixDecl& d : Matrices()) {
        const std::vector<float>& got = trainers_[w].param[d.name];
        const int64_t first = d.layout == v1::LAYOUT_ROW_SHARDED
                                  ? d.rows * w / kWorkers * d.cols
                                  : 0;
        EXPECT_EQ(std::memcmp(got.data(), param[d.name].data() + first,
                              got.size() * 4),
                  0)
            << d.name << " on trainer " << w;
      }
    }
  }

  std::vector<std::unique_ptr<transport::TcpListener>> listeners_;
  std::map<std::string, std::string> addresses_;
  Trainer trainers_[kWorkers];
  std::vector<std::unique_ptr<StepEngine>> engines_;
  std::atomic<bool> following_{false};
  std::atomic<int> followed_steps_{0};
  std::vector<std::thread> followers_;
};

TEST_F(StepEngineTest, EveryLayoutMatchesTheKernelsInOneProcessBitForBit) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  StepAndMatchTheKernelsInOneProcess(5);
}

// bf16 trainers: the workers widen the gradients, keep fp32 momentum, and
// round each updated parameter once; the same as the kernels in one
// process on the widened gradients, followed by that one rounding.
TEST_F(StepEngineTest, Bf16ParametersMatchTheKernelsInOneProcessBitForBit) {
  UseBf16Everywhere();
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  kernels::CpuKernels reference_kernels(kernels::CpuKernelOptions{});
  kernels::CpuDeviceOps ops;
  std::map<std::string, std::vector<uint16_t>> param;
  std::map<std::string, std::vector<float>> momentum;
  for (const MatrixDecl& d : Matrices()) {
    param[d.name].assign(d.rows * d.cols, FloatToBFloat16(0.5f));
    momentum[d.name].assign(d.rows * d.cols, 0.0f);
  }
  const kernels::MuonHyperparameters h = MuonFromJob();
  for (int64_t step = 0; step < 12; ++step) {
    WriteGradients(step);
    for (const absl::StatusOr<v1::StepResponse>& r : StepEverywhere(step)) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixDecl& d = Matrices()[m];
      std::vector<float> g = WholeGradient(step, static_cast<int>(m), true);
      const kernels::MatrixStack grad{g.data(), 1, d.rows, d.cols};
      ASSERT_TRUE(reference_kernels
                      .UpdateMomentum(
                          grad, {momentum[d.name].data(), 1, d.rows, d.cols},
                          h.momentum, h.nesterov, grad, kHostStream)
                      .ok());
      ASSERT_TRUE(
          reference_kernels.Orthogonalize(grad, grad, h.ns, kHostStream).ok());
      const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
      const float scale = static_cast<float>(
          -kernels::AdjustedLr(h.lr, h.lr_adjustment, d.rows, d.cols));
      ASSERT_TRUE(ops.ApplyScaled(param[d.name].data(), DType::kBFloat16,
                                  g.data(), d.rows * d.cols, decay, scale,
                                  kHostStream)
                      .ok());
    }
  }
  for (int w = 0; w < kWorkers; ++w) {
    for (const MatrixDecl& d : Matrices()) {
      const std::vector<uint16_t>& got = trainers_[w].param16[d.name];
      const int64_t first = d.layout == v1::LAYOUT_ROW_SHARDED
                                ? d.rows * w / kWorkers * d.cols
                                : 0;
      EXPECT_EQ(
          std::memcmp(got.data(), param[d.name].data() + first, got.size() * 2),
          0)
          << d.name << " on trainer " << w;
      EXPECT_NE(got[0], FloatToBFloat16(0.5f)) << d.name << " never moved";
    }
  }
}

TEST_F(StepEngineTest, NonFiniteGradientOnOneTrainerRejectsTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  trainers_[2].grad["unr.b"][7] = NAN;
  const std::vector<absl::StatusOr<v1::StepResponse>> out = StepEverywhere(0);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_FALSE(out[w].ok());
    EXPECT_EQ(out[w].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(out[w].status().message().find("\"unr.b\": element 7 is NaN"),
              std::string::npos)
        << out[w].status();
    for (const MatrixDecl& d : Matrices()) {
      for (float v : trainers_[w].param[d.name]) ASSERT_EQ(v, 0.5f) << d.name;
    }
  }
  // The transports survive a rejection: the same step id, now finite.
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
  // And a retried id is a no-op.
  const std::vector<float> before = trainers_[0].param["rep.a"];
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->already_applied());
  }
  EXPECT_EQ(trainers_[0].param["rep.a"], before);
}

// The engine hands the factory the secret it was last given: with none the
// TCP transport refuses to connect, naming the field; once the job's
// secret arrives the next step connects and runs.
TEST_F(StepEngineTest, StepsNeedTheDataPlaneSecretGivenToTheEngine) {
  for (auto& engine : engines_) engine->SetDataPlaneSecret("");
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("TcpOptions.data_plane_secret"),
              std::string::npos)
        << r.status();
  }
  for (auto& engine : engines_) {
    engine->SetDataPlaneSecret(transport::kLoopbackSecret);
  }
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// Hyperparameters are checked and agreed like gradients: a NaN group lr on
// one trainer, or trainers whose lr differ, refuse the step on every worker
// with the reason, and nothing changes.
TEST_F(StepEngineTest, BadOrDisagreeingHyperparametersRefuseTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  const std::vector<float> before = trainers_[1].param["rep.a"];
  const std::vector<
      std::pair<std::string, std::function<void(int, v1::StepRequest*)>>>
      cases = {
          {"groups[0].lr: nan",
           [](int w, v1::StepRequest* r) {
             v1::ParamGroup* g = r->add_groups();
             g->add_matrices("rep.a");
             g->set_lr(w == 2 ? NAN : 0.01);
             g->set_weight_decay(0.1);
           }},
          {"lr: inf",
           [](int w, v1::StepRequest* r) {
             if (w == 0) r->set_lr(INFINITY);
           }},
          {"step with different lr, weight_decay",
           [](int w, v1::StepRequest* r) { r->set_lr(w == 1 ? 0.03 : 0.02); }},
      };
  for (const auto& [reason, edit] : cases) {
    const std::vector<absl::StatusOr<v1::StepResponse>> out =
        StepEverywhere(0, edit);
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_FALSE(out[w].ok()) << reason;
      EXPECT_EQ(out[w].status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(out[w].status().message().find(reason), std::string::npos)
          << out[w].status();
    }
    EXPECT_EQ(trainers_[1].param["rep.a"], before) << reason;
  }
  // The transports survive: the same step with good hyperparameters.
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// Lent memory that is no longer whole (a truncated segment) is not read:
// the step is refused on every worker naming it, and the next one runs.
TEST_F(StepEngineTest, MemoryNoLongerIntactRefusesTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  trainers_[1].intact = absl::FailedPreconditionError(
      "shared memory segment \"/muonps-x\": truncated to 0 of its 4096 bytes");
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("truncated to 0"), std::string::npos)
        << r.status();
  }
  for (const MatrixDecl& d : Matrices()) {
    for (float v : trainers_[0].param[d.name]) ASSERT_EQ(v, 0.5f) << d.name;
  }
  trainers_[1].intact = absl::OkStatus();
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// A shared-memory segment not named for the job, the trainer's rank and
// pid is refused before anything maps it, naming the field.
TEST_F(StepEngineTest, SegmentNotNamedForThisJobAndTrainerIsRefused) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  for (const char* name :
       {"/muonps-other-job-r0-77-1", "/muonps-engine-test-r1-77-1",
        "/muonps-engine-test-r0-78-1", "/muonps-engine-test-r0-77",
        "/anything"}) {
    v1::AttachRequest request;
    request.set_trainer_rank(0);
    request.set_trainer_count(kWorkers);
    request.set_trainer_pid(77);
    request.set_segment(name);
    request.set_segment_bytes(4096);
    const absl::StatusOr<v1::AttachResponse> attached =
        engines_[0]->Attach(request);
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_NE(attached.status().message().find("segment"), std::string::npos)
        << attached.status();
  }
}

// Status and heartbeats read last_step() while a step waits on its peers:
// it must answer at once, not after the step (or its timeout).
TEST_F(StepEngineTest, LastStepNeverWaitsForAStepInProgress) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  v1::StepRequest request;
  request.set_step_id(0);
  request.set_lr(-1);
  request.set_weight_decay(-1);
  absl::StatusOr<v1::StepResponse> first = absl::UnknownError("not run");
  std::thread waiting([&] { first = engines_[0]->Step(request); });
  absl::SleepFor(absl::Milliseconds(200));  // rank 0 now waits on the others
  const absl::Time asked = absl::Now();
  EXPECT_EQ(engines_[0]->last_step(), -1);
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(100));
  std::vector<std::thread> others;
  for (int w = 1; w < kWorkers; ++w) {
    others.emplace_back([&, w] { (void)engines_[w]->Step(request); });
  }
  for (std::thread& t : others) t.join();
  waiting.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(engines_[0]->last_step(), 0);
}

TEST_F(StepEngineTest, NewPlanKeepsMomentumOfUnmovedItemsAndCountsTheOthers) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) ASSERT_TRUE(r.ok()) << r.status();
  // A shift of 3 keeps every owner (3 workers); a shift of 1 moves all.
  absl::StatusOr<std::vector<float>> kept = engines_[0]->Momentum("rep.a", 0);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(2, 3)));
  absl::StatusOr<std::vector<float>> after = engines_[0]->Momentum("rep.a", 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*kept, *after);
  // Now move everything: the new owners start over and say so.
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(3, 1)));
  EXPECT_EQ(engines_[0]->Momentum("rep.a", 0).status().code(),
            absl::StatusCode::kNotFound);  // w1 owns it now, not stepped
  WriteGradients(1);
  int64_t resets = 0;
  for (const auto& r : StepEverywhere(1)) {
    ASSERT_TRUE(r.ok()) << r.status();
    resets += r->momentum_reset();
  }
  EXPECT_EQ(resets, static_cast<int64_t>(Matrices().size()));
}

TEST_F(StepEngineTest, BuffersOfATrainerWhoseProcessIsGoneAreReleased) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  // A live trainer (this process) keeps its buffers.
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere(getpid()));
  EXPECT_FALSE(engines_[0]->ReleaseTrainerIfGone());
  // A trainer process that exited (and was reaped) loses them.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere(child));
  EXPECT_TRUE(engines_[0]->ReleaseTrainerIfGone());
  EXPECT_FALSE(engines_[0]->ReleaseTrainerIfGone());  // once
  v1::StepRequest request;
  request.set_step_id(0);
  absl::StatusOr<v1::StepResponse> step = engines_[0]->Step(request);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(step.status().message().find("no trainer buffers"),
            std::string::npos)
      << step.status();
}

// A fourth worker with no trainer (a GPU of a dedicated optimizer pool),
// ranked last: it owns a replicated matrix (trainer 0's worker sends it the
// gradient), an unreduced one (its part of the sum is zeros) and a
// row-sharded one (it gathers every trainer's rows and scatters the update
// back), steps whenever the others do, and the trainers' parameters stay
// bit-identical to the kernels in one process; the unreduced AdamW
// gradient is still the trainers' mean.
class StepEngineDedicatedTest : public StepEngineTest {
 protected:
  int Dedicated() const override { return 1; }
};

TEST_F(StepEngineDedicatedTest, AWorkerWithNoTrainerOwnsMatricesOfEveryLayout) {
  // rep.a, unr.a and row.a on the dedicated w3; rep.b on w0, unr.b on w1.
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(
      PlanWithOwnerList(1, {3, 0, 3, 1, 3}, kWorkers + 1, /*dedicated=*/1)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
  StartFollowing();
  StepAndMatchTheKernelsInOneProcess(6);
  // The dedicated engine returns from its part of the last step a moment
  // after the others may have.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (followed_steps_.load() < 6 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(followed_steps_.load(), 6);
  for (const char* owned : {"rep.a", "unr.a", "row.a"}) {
    EXPECT_TRUE(engines_[3]->Momentum(owned, 0).ok()) << owned;
  }
  // The last step's bias gradients: their mean, summed in trainer order.
  for (int i = 0; i < 7; ++i) {
    float sum = 0;
    for (int t = 0; t < kWorkers; ++t) sum += GradValue(5, 99, t, i);
    const float mean = sum * (1.0f / static_cast<float>(kWorkers));
    for (int w = 0; w < kWorkers; ++w) {
      EXPECT_EQ(trainers_[w].bias_grad[i], mean) << w << " " << i;
    }
  }
  // The dedicated worker takes no trainer.
  v1::AttachRequest request;
  request.set_trainer_rank(0);
  request.set_trainer_count(kWorkers);
  const absl::StatusOr<v1::AttachResponse> refused =
      engines_[3]->Attach(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dedicated"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace worker
}  // namespace muonps
