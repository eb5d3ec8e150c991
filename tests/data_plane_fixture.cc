#include "tests/data_plane_fixture.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "proto/grpc_status.h"
#include "proto/translate.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace testing {
namespace {

using scheduler::Layout;

constexpr absl::Duration kStartTimeout = absl::Seconds(30);

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return DeadlineIn(d);
}

absl::Status FromGrpc(const grpc::Status& s) {
  return ::muonps::FromGrpc(s, "");
}

// splitmix64's finalizer, folded over the parts.
uint64_t Hash(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t p : parts) {
    h ^= p;
    h += 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

// Index into the full tensor (experts x rows x cols) of element `i` of a
// buffer that holds rows [begin, end) of every expert, expert-major.
int64_t FullIndex(int64_t i, int64_t rows, int64_t cols, int64_t begin,
                  int64_t end) {
  const int64_t local = (end - begin) * cols;
  return (i / local) * rows * cols + begin * cols + i % local;
}

std::string ItemKey(const std::string& name, int64_t expert) {
  return absl::StrCat(name, "[", expert, "]");
}

bool ShardedParam(const MatrixDecl& m) {
  return m.options.layout == Layout::kRowSharded && m.options.shard_params;
}

}  // namespace

ModelDecl SmallModel(Layout layout, bool shard_params) {
  ModelDecl model;
  const MatrixOptions o{.layout = layout, .shard_params = shard_params};
  auto with = [o](int32_t layer, int64_t experts) {
    MatrixOptions out = o;
    out.layer = layer;
    out.experts = experts;
    return out;
  };
  model.matrices = {
      {"layers.0.attn.qkv", 64, 64, with(0, 1)},
      {"layers.0.mlp.up", 48, 32, with(0, 1)},
      {"layers.1.mlp.down", 32, 80, with(1, 1)},
      {"layers.2.moe.experts", 40, 24, with(2, 3)},
      {"layers.2.attn.out", 64, 64, with(2, 1)},
  };
  model.tensors = {
      {"layers.0.norm.bias", 64, Layout::kUnreduced},
      {"head.bias", 80, Layout::kReplicated},
  };
  model.muon.lr = 0.02;
  model.muon.weight_decay = 0.1;
  model.muon.momentum = 0.9;
  model.muon.nesterov = true;
  model.adamw.lr = 0.01;
  model.adamw.weight_decay = 0.01;
  return model;
}

ModelDecl MixedModel() {
  ModelDecl model = SmallModel(Layout::kReplicated);
  model.matrices[1].options.layout = Layout::kUnreduced;
  model.matrices[2].options.layout = Layout::kRowSharded;
  model.matrices[3].options.layout = Layout::kRowSharded;
  model.matrices[3].options.shard_params = false;
  model.matrices[4].options.layout = Layout::kUnreduced;
  model.muon.nesterov = false;
  model.muon.lr = 0.01;
  model.muon.lr_adjustment = kernels::LrAdjustment::kMatchRmsAdamW;
  return model;
}

float InitialParam(int tensor, int64_t index) {
  const uint64_t h =
      Hash({1, static_cast<uint64_t>(tensor), static_cast<uint64_t>(index)});
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) / 20000.0f;
}

float Gradient(int tensor, int64_t step, int rank, int64_t index) {
  const uint64_t h =
      Hash({2, static_cast<uint64_t>(tensor), static_cast<uint64_t>(step),
            static_cast<uint64_t>(rank + 1), static_cast<uint64_t>(index)});
  return static_cast<float>(static_cast<int64_t>(h % 2049) - 1024) / 1024.0f;
}

double MaxRelativeError(absl::Span<const float> actual,
                        absl::Span<const float> expected) {
  if (actual.size() != expected.size() || expected.empty()) {
    return std::numeric_limits<double>::infinity();
  }
  double squares = 0;
  for (float e : expected) squares += static_cast<double>(e) * e;
  const double rms = std::sqrt(squares / static_cast<double>(expected.size()));
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double scale =
        std::max({std::fabs(static_cast<double>(expected[i])), rms, 1e-30});
    worst = std::max(
        worst, std::fabs(static_cast<double>(actual[i]) - expected[i]) / scale);
  }
  return worst;
}

ReferenceModel::ReferenceModel(ModelDecl model, int trainers,
                               AlgorithmMap algorithms)
    : model_(std::move(model)),
      trainers_(trainers),
      algorithms_(std::move(algorithms)) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    const int64_t n = m.rows * m.cols * m.options.experts;
    std::vector<float>& param = params_[m.name];
    for (int64_t i = 0; i < n; ++i) param.push_back(InitialParam(t, i));
    momentum_[m.name].assign(n, 0.0f);
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    std::vector<float>& param = params_[d.name];
    for (int64_t i = 0; i < d.elements; ++i) {
      param.push_back(InitialParam(t, i));
    }
    exp_avg_[d.name].assign(d.elements, 0.0f);
    exp_avg_sq_[d.name].assign(d.elements, 0.0f);
    ++t;
  }
}

std::vector<float> ReferenceModel::MeanGradient(int tensor,
                                                int64_t step) const {
  const int matrices = static_cast<int>(model_.matrices.size());
  int64_t n = 0;
  Layout layout = Layout::kReplicated;
  if (tensor < matrices) {
    const MatrixDecl& m = model_.matrices[tensor];
    n = m.rows * m.cols * m.options.experts;
    layout = m.options.layout;
  } else {
    n = model_.tensors[tensor - matrices].elements;
    layout = model_.tensors[tensor - matrices].layout;
  }
  std::vector<float> mean(n, 0.0f);
  if (layout != Layout::kUnreduced) {
    for (int64_t i = 0; i < n; ++i) mean[i] = Gradient(tensor, step, -1, i);
    return mean;
  }
  // As the workers: an fp32 sum in rank order, times the fp32 inverse.
  for (int r = 0; r < trainers_; ++r) {
    for (int64_t i = 0; i < n; ++i) mean[i] += Gradient(tensor, step, r, i);
  }
  const float inverse = 1.0f / static_cast<float>(trainers_);
  for (float& g : mean) g *= inverse;
  return mean;
}

absl::Status ReferenceModel::Step(int64_t step) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    std::vector<float> grad = MeanGradient(t++, step);
    const int64_t size = m.rows * m.cols;
    for (int64_t e = 0; e < m.options.experts; ++e) {
      kernels::MuonHyperparameters hyper = model_.muon;
      auto chosen = algorithms_.find({m.name, e});
      hyper.ns.algorithm = chosen == algorithms_.end()
                               ? kernels::NsAlgorithm::kNs5
                               : chosen->second;
      kernels::MuonStack stack;
      stack.names = {m.name};
      stack.grad = {grad.data() + e * size, 1, m.rows, m.cols};
      stack.momentum = {momentum_[m.name].data() + e * size, 1, m.rows, m.cols};
      stack.param = {params_[m.name].data() + e * size, 1, m.rows, m.cols};
      absl::Status status = kernels_.MuonStep(stack, hyper, kHostStream);
      if (!status.ok()) return status;
    }
  }
  ++adamw_steps_;
  for (const TensorDecl& d : model_.tensors) {
    const std::vector<float> grad = MeanGradient(t++, step);
    absl::Status status = kernels_.AdamWStep(
        {d.name, params_[d.name].data(), grad.data(), exp_avg_[d.name].data(),
         exp_avg_sq_[d.name].data(), d.elements},
        model_.adamw, adamw_steps_, kHostStream);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

const std::vector<float>& ReferenceModel::param(const std::string& name) const {
  return params_.at(name);
}

std::vector<float> ReferenceModel::momentum(const std::string& name,
                                            int64_t expert) const {
  for (const MatrixDecl& m : model_.matrices) {
    if (m.name != name) continue;
    const int64_t size = m.rows * m.cols;
    const std::vector<float>& all = momentum_.at(name);
    return std::vector<float>(all.begin() + expert * size,
                              all.begin() + (expert + 1) * size);
  }
  return {};
}

DataPlaneFixture::~DataPlaneFixture() {
  // Clients first: their segments are unlinked while the workers, which
  // only map them, may still run.
  clients_.clear();
  for (WorkerProcess& w : workers_) w.process.reset();  // SIGKILL, reap
  coordinator_.reset();
  std::error_code ignored;
  if (!log_dir_.empty()) std::filesystem::remove_all(log_dir_, ignored);
  if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_, ignored);
}

void DataPlaneFixture::TearDown() {
  if (!HasFailure()) return;
  if (coordinator_) std::cerr << "== coordinator log\n" << coordinator_->Log();
  for (const WorkerProcess& w : workers_) {
    if (w.process) std::cerr << "== " << w.id << " log\n" << w.process->Log();
  }
}

void DataPlaneFixture::StartCoordinator(const ClusterOptions& options) {
  coordinator_argv_ = {
      RunfilePath("server/coordinator/muonps-coordinator"),
      "--port=0",
      "--metrics_port=-1",
      "--host=" + options.host,
      absl::StrCat("--lease_ttl_ms=", options.lease_ttl_ms),
      absl::StrCat("--heartbeat_interval_ms=", options.heartbeat_interval_ms)};
  if (!options.state_dir.empty()) {
    coordinator_argv_.push_back("--state_dir=" + options.state_dir);
  }
  for (std::string& flag : SecuredCoordinatorFlags()) {
    coordinator_argv_.push_back(std::move(flag));
  }
  ASSERT_NO_FATAL_FAILURE(RestartCoordinator());
  coordinator_stub_ =
      v1::Coordinator::NewStub(TestChannel(coordinator_address_));
}

void DataPlaneFixture::RestartCoordinator() {
  if (!coordinator_address_.empty()) {  // the same port again
    coordinator_argv_[1] = absl::StrCat(
        "--port=",
        coordinator_address_.substr(coordinator_address_.rfind(':') + 1));
  }
  const std::string log = coordinator_starts_ == 0
                              ? log_dir_ + "/coordinator.log"
                              : absl::StrCat(log_dir_, "/coordinator.",
                                             coordinator_starts_, ".log");
  ++coordinator_starts_;
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(coordinator_argv_, log);
  ASSERT_TRUE(started.ok()) << started.status();
  coordinator_ = *std::move(started);
  const std::string host = options_.host;
  absl::StatusOr<std::string> port = coordinator_->WaitForLog(
      absl::StrCat("listening on ", absl::StrReplaceAll(host, {{".", "\\."}}),
                   ":(\\d+)"),
      kStartTimeout);
  ASSERT_TRUE(port.ok()) << port.status();
  coordinator_address_ = absl::StrCat(host, ":", *port);
}

void DataPlaneFixture::KillCoordinator() {
  coordinator_->Signal(SIGKILL);
  const absl::StatusOr<int> waited = coordinator_->Wait(absl::Seconds(10));
  ASSERT_TRUE(waited.ok()) << waited.status();
}

absl::StatusOr<v1::WorkerStatus> DataPlaneFixture::WorkerStatus(int worker) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(5)));
  v1::WorkerStatus status;
  const grpc::Status s = workers_.at(worker).stub->GetStatus(
      &context, v1::GetStatusRequest(), &status);
  if (!s.ok()) return FromGrpc(s);
  return status;
}

void DataPlaneFixture::WaitForCheckpointStatus(int worker, int64_t step,
                                               bool restored) {
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  int64_t seen = -2;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(worker);
    if (status.ok()) {
      seen =
          restored ? status->restored_step() : status->last_checkpoint_step();
      if (seen == step) return;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  FAIL() << "worker " << worker << " "
         << (restored ? "restored_step" : "last_checkpoint_step") << " is "
         << seen << ", not " << step;
}

void DataPlaneFixture::StartWorker(int index, const ClusterOptions& options) {
  WorkerProcess& w = workers_[index];
  w.id = absl::StrCat("w", index);
  w.socket = absl::StrCat(socket_dir_, "/", w.id, ".sock");
  std::vector<std::string> argv = {
      RunfilePath("server/worker/muonps-worker"),
      "--coordinator=" + coordinator_address_,
      absl::StrCat("--job=", job_),
      "--worker_id=" + w.id,
      "--socket=" + w.socket,
      "--metrics_port=-1",
      "--device=cpu",
      absl::StrCat("--io_timeout_ms=", options.io_timeout_ms)};
  auto host = options.worker_host.find(index);
  argv.push_back("--host=" + (host != options.worker_host.end()
                                  ? host->second
                                  : options.host));
  auto extra = options.worker_flags.find(index);
  if (extra != options.worker_flags.end()) {
    argv.insert(argv.end(), extra->second.begin(), extra->second.end());
  }
  auto wrapper = options.worker_wrapper.find(index);
  if (wrapper != options.worker_wrapper.end()) {
    argv.insert(argv.begin(), wrapper->second.begin(), wrapper->second.end());
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(argv, absl::StrCat(log_dir_, "/", w.id, ".log"));
  ASSERT_TRUE(started.ok()) << started.status();
  w.process = *std::move(started);
  w.stub = v1::Worker::NewStub(TestChannel("unix:" + w.socket));
}

void DataPlaneFixture::StartTrainers(absl::Status* start_status) {
  const int n = workers();
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::unique_ptr<Client>> created =
        Client::Create({.coordinator = coordinator_address_,
                        .job = job_,
                        .worker_socket = workers_[r].socket,
                        .trainer_rank = r,
                        .trainer_count = n,
                        .timeout = options_.client_timeout});
    ASSERT_TRUE(created.ok()) << created.status();
    if (!options_.checkpoint_dir.empty()) {
      ASSERT_TRUE((*created)
                      ->SetCheckpointing(options_.checkpoint_dir,
                                         options_.checkpoint_every)
                      .ok());
    }
    for (const MatrixDecl& m : model_.matrices) {
      ASSERT_TRUE((*created)->AddMatrix(m.name, m.rows, m.cols, m.options).ok())
          << m.name;
    }
    for (const TensorDecl& t : model_.tensors) {
      ASSERT_TRUE((*created)->AddTensor(t.name, t.elements, t.layout).ok())
          << t.name;
    }
    ASSERT_TRUE(
        (*created)->AllowMomentumReset(options_.allow_momentum_reset).ok());
    clients_.push_back(*std::move(created));
  }
  // Every rank starts at once, as trainer processes would.
  std::vector<absl::Status> started(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([this, r, &started] {
      started[r] = clients_[r]->Start(model_.muon, model_.adamw);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (start_status != nullptr && !started[r].ok()) {
      *start_status = started[r];
      return;
    }
    ASSERT_TRUE(started[r].ok()) << "trainer " << r << ": " << started[r];
  }
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    for (int r = 0; r < n; ++r) {
      const TensorBuffers b = Buffers(r, m.name);
      const bool sharded = ShardedParam(m);
      const int64_t begin = sharded ? b.row_begin : 0;
      const int64_t end = sharded ? b.row_end : m.rows;
      for (int64_t i = 0; i < b.param_elements; ++i) {
        b.param[i] = InitialParam(t, FullIndex(i, m.rows, m.cols, begin, end));
      }
    }
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    for (int r = 0; r < n; ++r) {
      const TensorBuffers b = Buffers(r, d.name);
      for (int64_t i = 0; i < b.param_elements; ++i) {
        b.param[i] = InitialParam(t, i);
      }
    }
    ++t;
  }
}

absl::Status DataPlaneFixture::WaitForFullPlan(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::DeadlineExceededError("no plan yet");
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    v1::GetPlanRequest request;
    request.set_job(job_);
    v1::Plan plan;
    const grpc::Status got =
        coordinator_stub_->GetPlan(&context, request, &plan);
    bool ready = got.ok() && plan.workers_size() == workers();
    last = got.ok()
               ? absl::DeadlineExceededError(absl::StrCat(
                     "latest plan: ", plan.ShortDebugString().substr(0, 300)))
               : FromGrpc(got);
    for (int i = 0; ready && i < workers(); ++i) {
      grpc::ClientContext status_context;
      status_context.set_deadline(Deadline(absl::Seconds(5)));
      v1::WorkerStatus status;
      const grpc::Status s = workers_[i].stub->GetStatus(
          &status_context, v1::GetStatusRequest(), &status);
      ready = s.ok() && status.state() == "ready" &&
              status.plan_version() == plan.version();
      if (!ready) {
        last = absl::DeadlineExceededError(
            absl::StrCat(workers_[i].id, " is not on plan_version ",
                         plan.version(), ": ", status.ShortDebugString()));
      }
    }
    if (ready) {
      plan_ = plan;
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return last;
}

void DataPlaneFixture::StartJob(const ModelDecl& model,
                                const ClusterOptions& options,
                                absl::Status* start_status) {
  model_ = model;
  options_ = options;
  // Unique, since the tests' sandboxes share /dev/shm and a worker removes
  // the segments of its own job's trainers that look dead from its PID
  // namespace.
  job_ = absl::StrCat("data-plane-", getpid(), "-", std::random_device()());
  log_dir_ = NewTempDir("data_plane");
  ASSERT_FALSE(log_dir_.empty());
  // Unix socket paths hold at most 108 bytes, too few for TEST_TMPDIR.
  std::string socket_dir = "/tmp/muonps-dp-XXXXXX";
  ASSERT_NE(mkdtemp(socket_dir.data()), nullptr);
  socket_dir_ = socket_dir;
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(options));
  workers_.resize(options.workers);
  for (int i = 0; i < options.workers; ++i) {
    ASSERT_NO_FATAL_FAILURE(StartWorker(i, options));
  }
  for (WorkerProcess& w : workers_) {
    absl::StatusOr<std::string> up =
        w.process->WaitForLog("listening on unix:", kStartTimeout);
    ASSERT_TRUE(up.ok()) << up.status();
  }
  ASSERT_NO_FATAL_FAILURE(StartTrainers(start_status));
  if (start_status != nullptr && !start_status->ok()) return;
  const absl::Status planned = WaitForFullPlan(kStartTimeout);
  ASSERT_TRUE(planned.ok()) << planned;
}

void DataPlaneFixture::WriteGradients(int rank, int64_t step) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    const TensorBuffers b = Buffers(rank, m.name);
    const int from = m.options.layout == Layout::kUnreduced ? rank : -1;
    for (int64_t i = 0; i < b.elements; ++i) {
      b.grad[i] = Gradient(
          t, step, from, FullIndex(i, m.rows, m.cols, b.row_begin, b.row_end));
    }
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    const TensorBuffers b = Buffers(rank, d.name);
    const int from = d.layout == Layout::kUnreduced ? rank : -1;
    for (int64_t i = 0; i < b.elements; ++i) {
      b.grad[i] = Gradient(t, step, from, i);
    }
    ++t;
  }
}

TensorBuffers DataPlaneFixture::Buffers(int rank,
                                        const std::string& name) const {
  absl::StatusOr<TensorBuffers> b = clients_.at(rank)->Buffers(name);
  if (!b.ok()) {
    ADD_FAILURE() << "rank " << rank << ": " << b.status();
    return {};
  }
  return *b;
}

std::vector<std::optional<StepOutcome>> DataPlaneFixture::RunStep(
    int64_t step, const StepScript& script) {
  std::vector<std::optional<StepOutcome>> out(trainers());
  std::vector<std::thread> threads;
  for (int r = 0; r < trainers(); ++r) {
    if (script.silent.count(r) != 0) continue;
    threads.emplace_back([this, r, step, &script, &out] {
      auto delay = script.delay.find(r);
      if (delay != script.delay.end()) absl::SleepFor(delay->second);
      if (script.write_gradients) WriteGradients(r, step);
      if (script.after_write) script.after_write(r);
      const absl::Time start = absl::Now();
      absl::StatusOr<StepResult> result = clients_[r]->Step(step);
      out[r] = StepOutcome{std::move(result), absl::Now() - start};
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

absl::StatusOr<std::vector<float>> DataPlaneFixture::Momentum(
    int worker, const std::string& matrix, int64_t expert) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(10)));
  v1::GetMomentumRequest request;
  request.set_matrix(matrix);
  request.set_expert(expert);
  v1::GetMomentumResponse response;
  const grpc::Status s =
      workers_.at(worker).stub->GetMomentum(&context, request, &response);
  if (!s.ok()) return FromGrpc(s);
  return std::vector<float>(response.values().begin(), response.values().end());
}

StateSnapshot DataPlaneFixture::Snapshot() {
  StateSnapshot out;
  out.params.resize(trainers());
  for (int r = 0; r < trainers(); ++r) {
    auto copy = [&](const std::string& name) {
      const TensorBuffers b = Buffers(r, name);
      out.params[r][name].assign(b.param, b.param + b.param_elements);
    };
    for (const MatrixDecl& m : model_.matrices) copy(m.name);
    for (const TensorDecl& d : model_.tensors) copy(d.name);
    out.adamw_steps.push_back(clients_[r]->adamw_steps());
  }
  for (const MatrixDecl& m : model_.matrices) {
    for (int64_t e = 0; e < m.options.experts; ++e) {
      absl::StatusOr<std::vector<float>> got =
          Momentum(Owner(m.name, e), m.name, e);
      if (got.ok()) {
        out.momentum[ItemKey(m.name, e)] = *std::move(got);
      } else if (got.status().code() != absl::StatusCode::kNotFound) {
        ADD_FAILURE() << ItemKey(m.name, e) << ": " << got.status();
      }
    }
  }
  return out;
}

void DataPlaneFixture::ExpectMatchesReference(const ReferenceModel& reference,
                                              double tolerance) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    const std::vector<float>& full = reference.param(m.name);
    // A step that did nothing must not pass: the reference moved far.
    std::vector<float> initial(full.size());
    for (size_t i = 0; i < full.size(); ++i) initial[i] = InitialParam(t, i);
    EXPECT_GT(MaxRelativeError(initial, full), 100 * tolerance) << m.name;
    for (int r = 0; r < trainers(); ++r) {
      const TensorBuffers b = Buffers(r, m.name);
      const bool sharded = ShardedParam(m);
      const int64_t begin = sharded ? b.row_begin : 0;
      const int64_t end = sharded ? b.row_end : m.rows;
      std::vector<float> expected(b.param_elements);
      for (int64_t i = 0; i < b.param_elements; ++i) {
        expected[i] = full[FullIndex(i, m.rows, m.cols, begin, end)];
      }
      EXPECT_LE(MaxRelativeError(absl::MakeConstSpan(b.param, b.param_elements),
                                 expected),
                tolerance)
          << "trainer " << r << " param " << m.name << " rows [" << begin
          << ", " << end << ")";
    }
    for (int64_t e = 0; e < m.options.experts; ++e) {
      const int owner = Owner(m.name, e);
      absl::StatusOr<std::vector<float>> got = Momentum(owner, m.name, e);
      ASSERT_TRUE(got.ok()) << ItemKey(m.name, e) << " on "
                            << workers_[owner].id << ": " << got.status();
      EXPECT_LE(MaxRelativeError(*got, reference.momentum(m.name, e)),
                tolerance)
          << "momentum of " << ItemKey(m.name, e) << " on "
          << workers_[owner].id;
    }
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    const std::vector<float>& full = reference.param(d.name);
    for (int r = 0; r < trainers(); ++r) {
      const TensorBuffers b = Buffers(r, d.name);
      EXPECT_LE(MaxRelativeError(absl::MakeConstSpan(b.param, b.param_elements),
                                 full),
                tolerance)
          << "trainer " << r << " AdamW param " << d.name;
    }
    ++t;
  }
}

int DataPlaneFixture::WorkerIndex(const std::string& worker_id) const {
  for (int i = 0; i < workers(); ++i) {
    if (workers_[i].id == worker_id) return i;
  }
  ADD_FAILURE() << "no worker " << worker_id;
  return 0;
}

int DataPlaneFixture::Owner(const std::string& matrix, int64_t expert) const {
  for (const v1::MatrixPlacement& p : plan_.matrices()) {
    if (p.name() == matrix && expert < p.owners_size()) {
      return WorkerIndex(p.owners(static_cast<int>(expert)));
    }
  }
  ADD_FAILURE() << "the plan does not place " << ItemKey(matrix, expert);
  return 0;
}

int DataPlaneFixture::WorkerAtPlanRank(int plan_rank) const {
  return WorkerIndex(plan_.workers(plan_rank));
}

AlgorithmMap DataPlaneFixture::PlannedAlgorithms() const {
  // As a worker does (StepEngine::SetPlan): the plan through the one proto
  // translation, the step schedule of the job's matrices (the client leaves
  // bucket_bytes at its default), and each stack's chunks.
  std::vector<scheduler::MatrixSpec> matrices;
  for (const MatrixDecl& m : model_.matrices) {
    scheduler::MatrixSpec& spec = matrices.emplace_back();
    spec.name = m.name;
    spec.rows = m.rows;
    spec.cols = m.cols;
    spec.experts = m.options.experts;
    spec.layout = m.options.layout;
    spec.layer = m.options.layer;
  }
  AlgorithmMap out;
  const absl::StatusOr<scheduler::OwnershipPlan> ownership =
      proto::OwnershipFromPlan(plan_, matrices);
  if (!ownership.ok()) {
    ADD_FAILURE() << ownership.status();
    return out;
  }
  const absl::StatusOr<scheduler::StepSchedule> schedule =
      scheduler::BuildStepSchedule(matrices, *ownership);
  if (!schedule.ok()) {
    ADD_FAILURE() << schedule.status();
    return out;
  }
  for (const scheduler::OwnerStack& stack : schedule->stacks) {
    size_t item = 0;
    for (const scheduler::StackChunk& chunk : stack.chunks) {
      for (int64_t k = 0; k < chunk.count; ++k, ++item) {
        const scheduler::ItemRef& ref = stack.items[item];
        out[{matrices[ref.matrix].name, ref.expert}] = chunk.algorithm;
      }
    }
  }
  return out;
}

void DataPlaneFixture::KillWorker(int worker) {
  ChildProcess& p = *workers_.at(worker).process;
  p.Signal(SIGKILL);
  const absl::StatusOr<int> waited = p.Wait(absl::Seconds(10));
  ASSERT_TRUE(waited.ok()) << waited.status();
}

void DataPlaneFixture::SignalWorker(int worker, int signal) {
  ASSERT_TRUE(workers_.at(worker).process->running());
  workers_[worker].process->Signal(signal);
}

}  // namespace testing
}  // namespace muonps
