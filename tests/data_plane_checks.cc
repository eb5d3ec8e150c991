// What DataPlaneFixture observes and checks: the plan every worker follows
// (WaitForFullPlan) and who owns what in it, the algorithms it gives each
// expert, a worker's status and momentum, snapshots of the trainers' and
// owners' state, and the comparison of both with the reference.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/row_ranges.h"
#include "proto/grpc_status.h"
#include "proto/translate.h"
#include "scheduler/step_schedule.h"
#include "tests/data_plane_fixture.h"
#include "tests/data_plane_fixture_internal.h"

namespace muonps {
namespace testing {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return DeadlineIn(d);
}

absl::Status FromGrpc(const grpc::Status& s) {
  return ::muonps::FromGrpc(s, "");
}

std::string ItemKey(const std::string& name, int64_t expert) {
  return absl::StrCat(name, "[", expert, "]");
}

}  // namespace

absl::StatusOr<v1::Plan> DataPlaneFixture::LatestPlan() {
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(5)));
  v1::GetPlanRequest request;
  request.set_job(job_);
  v1::Plan plan;
  const grpc::Status got = coordinator_stub_->GetPlan(&context, request, &plan);
  if (!got.ok()) return FromGrpc(got);
  return plan;
}

absl::StatusOr<v1::ListWorkersResponse> DataPlaneFixture::ListWorkers() {
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(5)));
  v1::ListWorkersRequest request;
  request.set_job(job_);
  v1::ListWorkersResponse listed;
  const grpc::Status got =
      coordinator_stub_->ListWorkers(&context, request, &listed);
  if (!got.ok()) return FromGrpc(got);
  return listed;
}

bool DataPlaneFixture::KnowsWholeExpertHolders(const v1::Plan& plan) const {
  // A job whose trainers hold whole experts re-plans once its heartbeats
  // name every trainer's rank (docs/architecture.md); one of one trainer
  // does not.
  const bool whole = std::any_of(
      model_.matrices.begin(), model_.matrices.end(), [](const MatrixDecl& m) {
        return m.options.shard_experts &&
               m.options.layout == scheduler::Layout::kRowSharded;
      });
  if (!whole || workers() < 2) return true;
  int known = 0;
  for (const v1::WorkerLoad& load : plan.loads()) {
    known += load.trainer_shard() >= 0 ? 1 : 0;
  }
  return plan.trainer_shards() > 0 &&
         known == plan.workers_size() - plan.dedicated_workers();
}

int DataPlaneFixture::ExpertsOwnedByHolders(const v1::Plan& plan) {
  std::vector<std::string> holder(std::max(plan.trainer_shards(), 0));
  for (const v1::WorkerLoad& load : plan.loads()) {
    const int32_t shard = load.trainer_shard();
    if (shard >= 0 && shard < static_cast<int32_t>(holder.size())) {
      holder[shard] = load.worker_id();
    }
  }
  if (holder.empty()) return 0;  // planned without the trainers' shards
  int home = 0;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    if (m.owners_size() < 2) continue;  // not a stack
    for (int e = 0; e < m.owners_size(); ++e) {
      const int shard = ShardHoldingExpert(m.owners_size(), e,
                                           static_cast<int>(holder.size()));
      home +=
          shard >= 0 && !holder[shard].empty() && m.owners(e) == holder[shard]
              ? 1
              : 0;
    }
  }
  return home;
}

absl::Status DataPlaneFixture::WaitForFullPlan(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::DeadlineExceededError("no plan yet");
  while (absl::Now() < deadline) {
    const absl::StatusOr<v1::Plan> got = LatestPlan();
    const v1::Plan plan = got.ok() ? *got : v1::Plan();
    bool ready = got.ok() && plan.workers_size() == workers() &&
                 KnowsWholeExpertHolders(plan);
    last = got.ok()
               ? absl::DeadlineExceededError(absl::StrCat(
                     "latest plan: ", plan.ShortDebugString().substr(0, 300)))
               : got.status();
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
      const int64_t first = sharded ? b.expert_begin : 0;
      std::vector<float> expected(b.param_elements);
      for (int64_t i = 0; i < b.param_elements; ++i) {
        expected[i] = full[FullIndex(i, m.rows, m.cols, begin, end, first)];
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
    spec.shard_experts = m.options.shard_experts;
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

}  // namespace testing
}  // namespace muonps
