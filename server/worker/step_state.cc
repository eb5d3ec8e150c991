#include "server/worker/step_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/row_relay.h"
#include "server/worker/step_protocol.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

namespace {

// Floats the control messages of a step need in transport memory.
constexpr int64_t kControlFloats = 1024;

// The room a binding's parameter takes in AttachedTrainer::kept: its bytes,
// in whole floats.
int64_t KeptBytes(const Binding& b) {
  const int64_t bytes =
      b.param_elements * static_cast<int64_t>(DTypeSize(b.dtype));
  return (bytes + 3) / 4 * 4;
}

}  // namespace

absl::StatusOr<PlanState> BuildPlanState(
    const JobPlan& plan, const std::map<std::string, std::string>& addresses,
    const std::string& worker_id) {
  PlanState next;
  next.job = plan.job;
  next.version = plan.membership.version;
  next.matrices = plan.job.matrices;
  next.window_at = FullStagedAt(next.matrices);
  next.muon = plan.job.muon;
  next.ownership = plan.ownership;
  const std::vector<std::string>& workers = plan.membership.workers;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r] == worker_id) next.rank = static_cast<int>(r);
    auto it = addresses.find(workers[r]);
    next.addresses.push_back(it == addresses.end() ? "" : it->second);
  }
  // The schedule checks the plan, its owner groups included.
  MUONPS_ASSIGN_OR_RETURN(
      next.schedule,
      scheduler::BuildStepSchedule(next.matrices, next.ownership,
                                   {.bucket_bytes = plan.job.bucket_bytes}));
  next.schedule_digest = ScheduleDigest(next.schedule);
  next.groups = scheduler::OwnerGroups(next.ownership);
  next.group = next.rank >= 0 ? next.groups.group_of(next.rank) : 0;
  next.group_members = next.groups.members(next.group);
  // The schedule's stacks this worker owns become its compute batches.
  next.batch_of_stack.assign(next.schedule.stacks.size(), -1);
  for (size_t k = 0; k < next.schedule.stacks.size(); ++k) {
    const scheduler::OwnerStack& stack = next.schedule.stacks[k];
    if (stack.owner != next.rank) continue;
    next.batch_of_stack[k] = static_cast<int>(next.batches.size());
    ComputeBatch batch;
    batch.rows = stack.rows;
    batch.cols = stack.cols;
    batch.items.assign(stack.items.begin(), stack.items.end());
    batch.chunks.assign(stack.chunks.begin(), stack.chunks.end());
    next.batches.push_back(std::move(batch));
  }
  return next;
}

absl::Status PlanState::AllocateBuffers(kernels::DeviceOps& ops) {
  int64_t largest = kControlFloats;
  for (const scheduler::MatrixSpec& spec : matrices) {
    largest = std::max(largest, spec.rows * spec.cols);
  }
  for (ComputeBatch& batch : batches) {
    const int64_t count =
        static_cast<int64_t>(batch.items.size()) * batch.rows * batch.cols;
    MUONPS_ASSIGN_OR_RETURN(batch.staged,
                            ops.Allocate(count, "staged gradients"));
    if (update_dtype == DType::kFloat32) continue;
    MUONPS_ASSIGN_OR_RETURN(
        batch.updates, kernels::TypedBuffer::Allocate(ops, update_dtype, count,
                                                      "16-bit updates"));
  }
  MUONPS_ASSIGN_OR_RETURN(scratch, ops.Allocate(largest, "scratch"));
  // The exchange's buckets in flight and the rows relayed across the nodes
  // (row_relay.h): none without exchange nodes.
  if (schedule.exchange_nodes.empty()) return absl::OkStatus();
  const int shards = job.replicas > 1 ? trainers() / job.replicas : trainers();
  const scheduler::ExchangeBuffers sizes = scheduler::ExchangeBuffersOf(
      schedule, matrices, static_cast<int>(ownership.worker_ids.size()), groups,
      shards, static_cast<int>(DTypeSize(update_dtype)));
  MUONPS_RETURN_IF_ERROR(
      PrepareExchange(schedule, sizes, rank, ops, &exchange));
  const int64_t relayed =
      rank >= 0 && rank < static_cast<int>(sizes.relay.size())
          ? sizes.relay[rank]
          : 1;
  if (relay == nullptr || relay->size() < relayed) {
    relay.reset();
    MUONPS_ASSIGN_OR_RETURN(relay, ops.Allocate(relayed, "relayed rows"));
  }
  return absl::OkStatus();
}

MomentumStacks PlanState::MomentumLayout() const {
  MomentumStacks layout;
  layout.version = version;
  layout.rank = rank;
  layout.matrices = matrices;
  layout.owners = ownership.owners;
  layout.groups = ownership.groups;
  for (const ComputeBatch& batch : batches) {
    MomentumStack stack;
    stack.rows = batch.rows;
    stack.cols = batch.cols;
    stack.items = batch.items;
    layout.stacks.push_back(std::move(stack));
  }
  layout.checkpoint_dir = job.checkpoint_dir;
  layout.checkpoint_every = job.checkpoint_every;
  layout.allow_momentum_reset = job.allow_momentum_reset;
  return layout;
}

absl::Status AttachedTrainer::PlaceGradients(
    const std::vector<GradientPlace>& places) {
  // By position in the attach request's order, the job matrix bound there.
  std::vector<int> matrix_at(matrices.size(), -1);
  for (size_t m = 0; m < bound_position.size(); ++m) {
    matrix_at[bound_position[m]] = static_cast<int>(m);
  }
  std::vector<int64_t> bytes;
  bytes.reserve(places.size());
  std::vector<bool> placed(matrices.size(), false);
  for (size_t i = 0; i < places.size(); ++i) {
    const int position = places[i].matrix;
    if (position < 0 || position >= static_cast<int>(matrices.size()) ||
        placed[position]) {
      return InvalidField(
          absl::StrCat("gradients[", i, "].matrix"),
          absl::StrCat(position,
                       " is not the position of a bound matrix (0 to ",
                       matrices.size(), " - 1) given once"));
    }
    placed[position] = true;
    const Binding& b = matrices[matrix_at[position]];
    bytes.push_back(b.elements * static_cast<int64_t>(DTypeSize(b.dtype)));
  }
  const auto point = [](Binding& b, void* gradient) {
    b.lent_grad = gradient;
    // A bf16 gradient is read through its widened copy.
    if (b.dtype == DType::kFloat32) b.grad = static_cast<float*>(gradient);
  };
  for (size_t position = 0; position < matrices.size(); ++position) {
    if (!placed[position] &&
        matrices[matrix_at[position]].home_grad == nullptr) {
      return InvalidField(
          "gradients",
          absl::StrCat("the matrix bound at position ", position,
                       " lends no gradient buffer: every step must place its "
                       "gradient"));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(const std::vector<void*> at,
                          buffers->MapPlaces(places, bytes));
  for (Binding& b : matrices) point(b, b.home_grad);
  for (size_t i = 0; i < places.size(); ++i) {
    point(matrices[matrix_at[places[i].matrix]], at[i]);
  }
  return absl::OkStatus();
}

absl::Status AttachedTrainer::AllocateWorkBuffers(kernels::DeviceOps& ops,
                                                  DType update_dtype,
                                                  WindowLender* lender) {
  std::vector<Binding*> narrow;
  int64_t total = 0;
  int64_t staged = 0, averaged = 0;
  int64_t kept_bytes = 0;
  for (Binding& b : matrices) {
    if (b.dtype != DType::kFloat32) narrow.push_back(&b);
    b.staged_at = staged;
    staged += b.param_elements;
    b.kept_at = kept_bytes;
    kept_bytes += KeptBytes(b);
  }
  for (auto& [name, b] : adamw) {
    if (b.dtype != DType::kFloat32) narrow.push_back(&b);
    if (b.layout != scheduler::Layout::kUnreduced) continue;
    b.staged_at = averaged;
    averaged += b.elements;
  }
  for (Binding* b : narrow) total += b->elements;
  widened.reset();
  kept.reset();
  updates = kernels::TypedBuffer();
  means.reset();
  window = WindowRecord{};
  landing = nullptr;
  const char* const what = "staged updates (one parameter-sized buffer)";
  const int64_t count = std::max<int64_t>(staged, 1);
  if (lender != nullptr && full_params) {
    absl::StatusOr<kernels::TypedBuffer> lent =
        lender->Allocate(update_dtype, count, what, &window);
    if (lent.ok()) {
      updates = *std::move(lent);
      landing = reinterpret_cast<uint64_t*>(static_cast<char*>(updates.at(0)) +
                                            LandingWordsAt(window.bytes));
    } else {
      window = WindowRecord{};
      spdlog::info(
          "staged updates not lent to the host's workers ({}): "
          "they arrive by the transport",
          lent.status().ToString());
    }
  }
  if (!updates) {
    MUONPS_ASSIGN_OR_RETURN(updates, kernels::TypedBuffer::Allocate(
                                         ops, update_dtype, count, what));
  }
  MUONPS_ASSIGN_OR_RETURN(
      means, ops.Allocate(std::max<int64_t>(averaged, 1),
                          "staged means of unreduced AdamW gradients"));
  if (total == 0) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(widened,
                          ops.Allocate(total, "fp32 copies of bf16 gradients"));
  float* next = widened->data();
  for (Binding* b : narrow) {
    b->grad = next;
    next += b->elements;
  }
  return absl::OkStatus();
}

absl::Status AttachedTrainer::AllocateKept(kernels::DeviceOps& ops) {
  if (kept != nullptr) return absl::OkStatus();
  int64_t bytes = 0;
  for (const Binding& b : matrices) bytes += KeptBytes(b);
  MUONPS_ASSIGN_OR_RETURN(
      kept, ops.Allocate(std::max<int64_t>(bytes / 4, 1),
                         "parameters kept while a step applied early is "
                         "undoable (one parameter-sized buffer)"));
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
