#include "server/worker/step_engine_fixture.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "scheduler/node_exchange.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

class HostBuffers final : public TrainerBuffers {
 public:
  // `record`: the trainer's step record's words, or null (none lent).
  HostBuffers(std::map<std::string, LentTensor> tensors,
              const absl::Status* intact, uint64_t* record)
      : tensors_(std::move(tensors)), intact_(intact), record_(record) {}
  Device device() const override { return kHostDevice; }
  absl::Status CheckIntact() const override { return *intact_; }
  absl::StatusOr<LentTensor> Map(const TensorBinding& t, int64_t,
                                 int64_t) override {
    auto it = tensors_.find(t.name);
    if (it == tensors_.end()) return absl::NotFoundError(t.name);
    return it->second;
  }
  absl::StatusOr<StepRecord> ReadRecord() override {
    if (record_ == nullptr) return absl::NotFoundError("no step record lent");
    return StepRecordFromWords(record_);
  }
  absl::Status WriteRecord(Stream, StepRecordWord word,
                           uint64_t value) override {
    if (record_ != nullptr) record_[static_cast<int>(word)] = value;
    return absl::OkStatus();
  }

 private:
  std::map<std::string, LentTensor> tensors_;
  const absl::Status* intact_;  // the trainer's
  uint64_t* const record_;
};

}  // namespace

absl::Status SetPlanFromProto(
    StepEngine& engine, const v1::JobSpec& job, const v1::Plan& plan,
    const std::map<std::string, std::string>& addresses) {
  MUONPS_ASSIGN_OR_RETURN(const JobPlan next, JobPlanFromProto(job, plan));
  return engine.SetPlan(next, addresses);
}

absl::StatusOr<AttachResponse> AttachFromProto(
    StepEngine& engine, const v1::AttachRequest& request) {
  MUONPS_ASSIGN_OR_RETURN(const AttachRequest attach,
                          AttachRequestFromProto(request));
  return engine.Attach(attach);
}

absl::StatusOr<StepResponse> StepFromProto(StepEngine& engine,
                                           const v1::StepRequest& request,
                                           const StepCancelled& cancelled) {
  return engine.Step(StepRequestFromProto(request), cancelled);
}

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

kernels::MuonHyperparameters MuonFromJob() {
  kernels::MuonHyperparameters h;
  h.lr = 0.02;
  h.weight_decay = 0.1;
  return h;
}

v1::JobSpec Job(int dedicated, int64_t bucket_bytes) {
  v1::JobSpec job;
  job.set_dedicated_workers(dedicated);
  job.set_name("engine-test");
  job.set_bucket_bytes(bucket_bytes);
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

v1::Plan PlanWithOwnerList(int64_t version, const std::vector<int>& owners,
                           int workers, int dedicated) {
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

v1::Plan PlanWithOwners(int64_t version, int shift) {
  std::vector<int> owners;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    owners.push_back(static_cast<int>((m + shift) % kWorkers));
  }
  return PlanWithOwnerList(version, owners);
}

v1::Plan PairOnW0(const std::vector<std::pair<int64_t, v1::NsAlgorithm>>& parts,
                  double predicted_seconds) {
  v1::Plan plan = PlanWithOwnerList(1, {0, 0, 1, 2, 1});
  v1::Batch* batch = plan.add_batches();
  batch->set_worker_id("w0");
  batch->set_rows(24);
  batch->set_cols(40);
  batch->add_matrices("rep.a");
  batch->add_matrices("rep.b");
  batch->set_predicted_seconds(predicted_seconds);
  for (const auto& [count, algorithm] : parts) {
    v1::BatchPart* part = batch->add_parts();
    part->set_count(count);
    part->set_algorithm(algorithm);
    part->set_predicted_seconds(predicted_seconds * count / 2);
  }
  batch->set_algorithm(parts.front().second);
  return plan;
}

ReferenceSteps::ReferenceSteps(std::map<std::string, NsAlgorithm> algorithms,
                               DType update_dtype,
                               std::vector<std::vector<int>> nodes)
    : kernels_(kernels::CpuKernelOptions{.update_dtype = update_dtype}),
      algorithms_(std::move(algorithms)),
      nodes_(std::move(nodes)) {
  for (const MatrixDecl& d : Matrices()) {
    param_[d.name].assign(d.rows * d.cols, 0.5f);
    momentum_[d.name].assign(d.rows * d.cols, 0.0f);
  }
}

void ReferenceSteps::Step(int64_t step) {
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixDecl& d = Matrices()[m];
    kernels::MuonHyperparameters h = MuonFromJob();
    auto chosen = algorithms_.find(d.name);
    if (chosen != algorithms_.end()) h.ns.algorithm = chosen->second;
    std::vector<float> g =
        WholeGradient(step, static_cast<int>(m), false, nodes_);
    kernels::MuonStack stack;
    stack.names = {d.name};
    stack.grad = {g.data(), 1, d.rows, d.cols};
    stack.momentum = {momentum_[d.name].data(), 1, d.rows, d.cols};
    stack.param = {param_[d.name].data(), 1, d.rows, d.cols};
    ASSERT_TRUE(kernels_.MuonStep(stack, h, kHostStream).ok());
  }
}

void StepEngineTest::SetUp() {
  const int total = kWorkers + Dedicated();
  absl::StatusOr<std::vector<std::unique_ptr<transport::TcpListener>>> l =
      transport::BindLoopbackListeners(total);
  ASSERT_TRUE(l.ok()) << l.status();
  listeners_ = *std::move(l);
  const std::vector<std::string> addresses = transport::AddressesOf(listeners_);
  engines_.resize(total);
  for (int w = 0; w < total; ++w) {
    faults_.push_back(std::make_unique<FaultState>());
    addresses_[absl::StrCat("w", w)] = addresses[w];
    metrics_.push_back(std::make_unique<MetricsRegistry>());
    write_counters_.push_back(
        {metrics_[w]->AddCounter("sent", "bytes written", {"op"}),
         metrics_[w]->AddCounter("received", "bytes received", {"op"}),
         metrics_[w]->AddCounter("calls", "writes", {"op"})});
    if (w >= kWorkers) {
      StepBackend backend = CpuStepBackend(IoTimeout(), UpdateDtype());
      if (!PeerWrites()) backend.windows.reset();
      engines_[w] = std::make_unique<StepEngine>(
          absl::StrCat("w", w), std::move(backend), Connector(w));
      engines_[w]->CountPeerWrites(write_counters_[w]);
      continue;
    }
    trainers_[w].rank = w;
    for (const MatrixDecl& d : Matrices()) {
      int64_t n = d.rows * d.cols;
      if (d.layout == v1::LAYOUT_ROW_SHARDED) {
        n = (d.rows * (w + 1) / kWorkers - d.rows * w / kWorkers) * d.cols;
      }
      trainers_[w].grad[d.name].assign(n, 0.0f);
      trainers_[w].param[d.name].assign(WholeParams() ? d.rows * d.cols : n,
                                        0.5f);
    }
    StepBackend backend = CpuStepBackend(IoTimeout(), UpdateDtype());
    if (!PeerWrites()) backend.windows.reset();
    backend.apply_early =
        ApplyEarly() ? EarlyApplyPolicy::kAsPlanned : EarlyApplyPolicy::kNever;
    Trainer* trainer = &trainers_[w];
    backend.open_buffers = [trainer,
                            lends_record = LendsRecord()](const AttachRequest&)
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
          new HostBuffers(lent, &trainer->intact,
                          lends_record ? trainer->record.data() : nullptr));
    };
    engines_[w] = std::make_unique<StepEngine>(
        absl::StrCat("w", w), std::move(backend), Connector(w));
    engines_[w]->CountPeerWrites(write_counters_[w]);
    FaultState* state = faults_[w].get();
    engines_[w]->set_step_hook([state](StepPoint point, int64_t step, int) {
      absl::MutexLock lock(&state->mu);
      if (point != StepPoint::kExchange || state->fired ||
          step != state->fault.step) {
        return;
      }
      if (!state->armed) state->counted = 0;
      state->armed = true;
    });
  }
  for (auto& engine : engines_) {
    engine->SetDataPlaneSecret(transport::kLoopbackSecret);
  }
}

void StepEngineTest::TearDown() {
  following_.store(false);
  for (std::thread& t : followers_) t.join();
}

void StepEngineTest::StartFollowing() {
  following_.store(true);
  for (int w = kWorkers; w < kWorkers + Dedicated(); ++w) {
    followers_.emplace_back([this, w] {
      while (following_.load()) {
        absl::StatusOr<std::optional<StepResponse>> step =
            engines_[w]->FollowStep(absl::Milliseconds(50));
        if (step.ok() && step->has_value()) followed_steps_.fetch_add(1);
      }
    });
  }
}

void StepEngineTest::SetPlanEverywhere(const v1::Plan& plan,
                                       int64_t bucket_bytes) {
  for (auto& e : engines_) {
    ASSERT_TRUE(
        SetPlanFromProto(*e, Job(Dedicated(), bucket_bytes), plan, addresses_)
            .ok());
  }
}

std::set<int> StepEngineTest::UpdatesByBroadcast(const v1::Plan& plan,
                                                 int64_t bucket_bytes) const {
  const absl::StatusOr<JobPlan> job =
      JobPlanFromProto(Job(Dedicated(), bucket_bytes), plan);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  const absl::StatusOr<PlanState> state = BuildPlanState(*job, {}, "w0");
  EXPECT_TRUE(state.ok()) << state.status();
  if (!state.ok()) return {};
  std::set<int> out;
  for (const scheduler::Bucket& bucket : state->schedule.buckets) {
    for (const scheduler::Transfer& x : bucket.from_owners) {
      if (x.by_collective) out.insert(x.item.matrix);
    }
  }
  return out;
}

void StepEngineTest::UseBf16Everywhere() {
  for (Trainer& t : trainers_) {
    t.bf16 = true;
    for (auto& [name, g] : t.grad) {
      t.grad16[name].assign(g.size(), 0);
      t.param16[name].assign(t.param[name].size(), FloatToBFloat16(0.5f));
    }
  }
}

v1::AttachRequest StepEngineTest::AttachRequestOf(int w, int64_t trainer_pid,
                                                  bool with_bias) {
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
    if (WholeParams()) b->set_param_elements(d.rows * d.cols);
    auto group = groups_.find(d.name);
    if (group != groups_.end()) b->set_group(group->second + 1);
  }
  return request;
}

void StepEngineTest::AttachEverywhere(int64_t trainer_pid, bool with_bias) {
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<AttachResponse> attached = AttachFromProto(
        *engines_[w], AttachRequestOf(w, trainer_pid, with_bias));
    ASSERT_TRUE(attached.ok()) << attached.status();
  }
}

void StepEngineTest::WriteGradientsOf(int w, int64_t step) {
  for (int i = 0; i < 7; ++i) {
    trainers_[w].bias_grad[i] = GradValue(step, 99, w, i);
  }
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixDecl& d = Matrices()[m];
    std::vector<float>& g = trainers_[w].grad[d.name];
    const int64_t first =
        d.layout == v1::LAYOUT_ROW_SHARDED ? d.rows * w / kWorkers * d.cols : 0;
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

void StepEngineTest::WriteGradients(int64_t step) {
  for (int w = 0; w < kWorkers; ++w) WriteGradientsOf(w, step);
}

std::vector<absl::StatusOr<StepResponse>> StepEngineTest::StepEverywhere(
    int64_t step, const std::function<void(int, v1::StepRequest*)>& edit,
    const std::function<StepCancelled(int)>& cancelled) {
  std::vector<absl::StatusOr<StepResponse>> out(kWorkers,
                                                absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      v1::StepRequest request;
      request.set_step_id(step);
      request.set_lr(-1);
      request.set_weight_decay(-1);
      request.set_adamw_lr(-1);
      if (edit) edit(w, &request);
      out[w] = StepFromProto(*engines_[w], request,
                             cancelled ? cancelled(w) : StepCancelled());
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<float> WholeGradient(int64_t step, int m, bool bf16,
                                 const std::vector<std::vector<int>>& nodes) {
  const MatrixDecl& d = Matrices()[m];
  std::vector<float> g(d.rows * d.cols, 0.0f);
  const int sources = d.layout == v1::LAYOUT_UNREDUCED ? kWorkers : 1;
  const auto value = [&](int s, size_t i) {
    const float v = GradValue(step, m, s, i);
    return bf16 ? BFloat16ToFloat(FloatToBFloat16(v)) : v;
  };
  if (sources > 1 && !nodes.empty()) {
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = scheduler::SumOverNodes(nodes,
                                     [&](int32_t s) { return value(s, i); });
    }
  } else {
    for (int s = 0; s < sources; ++s) {
      for (size_t i = 0; i < g.size(); ++i) g[i] += value(s, i);
    }
  }
  if (sources > 1) {
    for (float& v : g) v *= 1.0f / static_cast<float>(sources);
  }
  return g;
}

double StepEngineTest::PeerWriteBytes(int w) const {
  return write_counters_[w].sent->Value({"peer_write"});
}

double StepEngineTest::PeerReceivedBytes(int w) const {
  return write_counters_[w].received->Value({"peer_write"});
}

void StepEngineTest::ExpectParamsMatch(const ReferenceSteps& reference) {
  for (int w = 0; w < kWorkers; ++w) {
    for (const MatrixDecl& d : Matrices()) {
      const std::vector<float>& got = trainers_[w].param[d.name];
      const int64_t first = d.layout == v1::LAYOUT_ROW_SHARDED && !WholeParams()
                                ? d.rows * w / kWorkers * d.cols
                                : 0;
      EXPECT_EQ(std::memcmp(got.data(), reference.param(d.name).data() + first,
                            got.size() * 4),
                0)
          << d.name << " on trainer " << w;
    }
  }
}

void StepEngineTest::StepAndMatchTheKernelsInOneProcess(int64_t steps) {
  ReferenceSteps reference({}, UpdateDtype());
  for (int64_t step = 0; step < steps; ++step) {
    WriteGradients(step);
    for (const absl::StatusOr<StepResponse>& r : StepEverywhere(step)) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
    reference.Step(step);
  }
  ExpectParamsMatch(reference);
}

}  // namespace worker
}  // namespace muonps
