#include "server/worker/step_run.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"

namespace muonps {
namespace worker {
namespace {

constexpr size_t kProblemBytes = 480;

// What every rank tells rank 0 before a step (a multiple of 4 bytes, so it
// travels as floats through device memory too).
struct StepHeader {
  int64_t step_id;
  uint64_t hyper_hash;  // HyperHash of the trainer's request
  int32_t trainer_rank;
  int32_t trainer_count;
  char problem[kProblemBytes];  // "" or why this rank cannot step
};

// Rank 0's answer: go (with the step id, for workers with no trainer),
// or the first problem any rank reported.
struct StepDecision {
  int64_t step_id;
  int32_t go;
  int32_t padding;
  char problem[kProblemBytes];
};

// What workers with no trainer learn from rank 0 before a step's
// transfers, as int64 values: the unreduced AdamW tensors' sizes (name
// order), then per job matrix whether its trainers keep the whole
// parameter of a row-sharded gradient (1) or not (0).
struct FollowerInfoHeader {
  int64_t adamw_count;
  int64_t matrix_count;
};

static_assert(sizeof(StepHeader) % 4 == 0 && sizeof(StepDecision) % 4 == 0,
              "control messages travel as floats");

void CopyProblem(const std::string& text, char* out) {
  std::memset(out, 0, kProblemBytes);
  std::memcpy(out, text.data(), std::min(text.size(), kProblemBytes - 1));
}

// A digest of a step's lr, weight decay and groups (FNV-1a over their
// bytes): trainers that disagree about them would update their replicas
// differently, so the step is refused instead.
uint64_t HyperHash(const v1::StepRequest& r) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  auto mix_double = [&](double v) { mix(&v, sizeof(v)); };
  mix_double(r.lr());
  mix_double(r.weight_decay());
  for (const v1::ParamGroup& g : r.groups()) {
    mix_double(g.lr());
    mix_double(g.weight_decay());
    for (const std::string& name : g.matrices())
      mix(name.data(), name.size() + 1);
    mix("|", 1);
  }
  return h;
}

// Why the request's hyperparameters cannot be applied, or "".
std::string HyperProblem(const v1::StepRequest& r) {
  auto bad = [](double v, bool may_default) {
    return !std::isfinite(v) || (v < 0 && !may_default);
  };
  if (bad(r.lr(), true)) return absl::StrCat("lr: ", r.lr(), " is not finite");
  if (bad(r.weight_decay(), true)) {
    return absl::StrCat("weight_decay: ", r.weight_decay(), " is not finite");
  }
  for (int i = 0; i < r.groups_size(); ++i) {
    const v1::ParamGroup& g = r.groups(i);
    if (bad(g.lr(), false)) {
      return absl::StrCat("groups[", i, "].lr: ", g.lr(),
                          " is not a finite number >= 0");
    }
    if (bad(g.weight_decay(), false)) {
      return absl::StrCat("groups[", i, "].weight_decay: ", g.weight_decay(),
                          " is not a finite number >= 0");
    }
  }
  return "";
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

float* PlanState::SlotData(const ItemSlot& s, bool momentum_buffer) const {
  const ComputeBatch& b = batches[s.batch];
  const kernels::FloatBuffer& buffer =
      momentum_buffer ? *b.momentum : *b.staged;
  return buffer.data() + s.slot * b.rows * b.cols;
}

absl::Status AttachedTrainer::AllocateWidened(kernels::DeviceOps& ops) {
  std::vector<Binding*> narrow;
  int64_t total = 0;
  for (Binding& b : matrices) {
    if (b.dtype != DType::kFloat32) narrow.push_back(&b);
  }
  for (auto& [name, b] : adamw) {
    if (b.dtype != DType::kFloat32) narrow.push_back(&b);
  }
  for (Binding* b : narrow) total += b->elements;
  widened.reset();
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

StepRun::StepRun(PlanState* plan, const AttachedTrainer* trainer,
                 transport::Transport* transport, kernels::DeviceOps* ops,
                 kernels::MuonKernels* kernels, absl::Duration timeout)
    : plan_(*plan),
      trainer_(trainer),
      t_(*transport),
      ops_(*ops),
      kernels_(*kernels),
      stream_(ops->stream()),
      compute_(ops->compute_stream()),
      timeout_(timeout),
      trainers_(static_cast<int>(plan->ownership.worker_ids.size()) -
                plan->ownership.dedicated) {}

std::pair<int64_t, int64_t> StepRun::RowsOfTrainer(int64_t rows,
                                                   int trainer) const {
  return TrainerRowRange(rows, trainer, trainers_);
}

absl::Status StepRun::ThroughTransportMemory(
    void* host, size_t bytes,
    const std::function<absl::Status(void* data)>& exchange) {
  if (t_.memory() == MemoryKind::kHost) return exchange(host);
  const int64_t floats = static_cast<int64_t>(bytes / 4);
  std::unique_ptr<kernels::FloatBuffer> larger;
  float* device = plan_.scratch->data();
  if (plan_.scratch->size() < floats) {  // a long list of sizes
    MUONPS_ASSIGN_OR_RETURN(larger, ops_.Allocate(floats, "control message"));
    device = larger->data();
  }
  MUONPS_RETURN_IF_ERROR(
      ops_.Copy(device, static_cast<const float*>(host), floats, stream_));
  MUONPS_RETURN_IF_ERROR(exchange(device));
  MUONPS_RETURN_IF_ERROR(t_.Synchronize(stream_, timeout_));
  MUONPS_RETURN_IF_ERROR(
      ops_.Copy(static_cast<float*>(host), device, floats, stream_));
  return ops_.Synchronize(stream_);
}

std::string StepRun::LocalProblem() {
  if (trainer_ == nullptr) return "";
  const AttachedTrainer& trainer = *trainer_;
  std::vector<kernels::FloatSpan> spans;
  std::vector<std::string> names;
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    spans.push_back({trainer.matrices[m].grad, trainer.matrices[m].elements});
    names.push_back(plan_.matrices[m].name);
  }
  for (const auto& [name, b] : trainer.adamw) {
    spans.push_back({b.grad, b.elements});
    names.push_back(name);
  }
  absl::StatusOr<std::vector<int64_t>> bad =
      ops_.FirstNonFinite(spans, stream_);
  if (!bad.ok()) return absl::StrCat("finite check: ", bad.status().message());
  for (size_t k = 0; k < spans.size(); ++k) {
    if ((*bad)[k] < 0) continue;
    float value = 0;
    const bool read =
        ops_.Copy(&value, spans[k].data + (*bad)[k], 1, stream_).ok() &&
        ops_.Synchronize(stream_).ok();
    return absl::StrCat("grad of ", Quoted(names[k]), ": element ", (*bad)[k],
                        " is ",
                        !read               ? "not finite"
                        : std::isnan(value) ? "NaN"
                                            : "Inf");
  }
  return "";
}

absl::Status StepRun::WidenGradients() {
  auto widen = [&](const Binding& b) {
    if (b.dtype == DType::kFloat32) return absl::OkStatus();
    return ops_.ToFloat(b.grad, b.lent_grad, b.dtype, b.elements, stream_);
  };
  for (const Binding& b : trainer_->matrices) {
    MUONPS_RETURN_IF_ERROR(widen(b));
  }
  for (const auto& [name, b] : trainer_->adamw) {
    MUONPS_RETURN_IF_ERROR(widen(b));
  }
  return absl::OkStatus();
}

absl::Status StepRun::Agree(const v1::StepRequest& request) {
  const int size = t_.size();
  std::string local_problem = trainer_ == nullptr ? ""
                              : !intact_.ok() ? std::string(intact_.message())
                                              : HyperProblem(request);
  if (local_problem.empty()) local_problem = LocalProblem();
  StepHeader mine{};
  mine.step_id = request.step_id();
  mine.hyper_hash = HyperHash(request);
  mine.trainer_rank = trainer_ == nullptr ? -1 : trainer_->rank;
  mine.trainer_count = trainer_ == nullptr ? 0 : trainer_->count;
  CopyProblem(local_problem, mine.problem);
  StepDecision decision{};
  // Ranks with no trainer (the last ones) send no header: they wait for
  // the decision.
  trainer_rank_of_.assign(size, -1);
  if (plan_.rank == 0) {
    std::string problem = local_problem;
    std::vector<bool> seen(trainers_, false);
    for (int r = 0; r < trainers_; ++r) {
      StepHeader h = mine;
      if (r > 0) {
        MUONPS_RETURN_IF_ERROR(ThroughTransportMemory(
            &h, sizeof(h),
            [&](void* data) { return t_.Recv(data, sizeof(h), r, stream_); }));
      }
      h.problem[kProblemBytes - 1] = 0;
      trainer_rank_of_[r] = h.trainer_rank;
      if (!problem.empty()) continue;
      const std::string& who = plan_.ownership.worker_ids[r];
      if (h.problem[0] != 0) {
        problem = absl::StrCat("worker ", Quoted(who), ": ", h.problem);
      } else if (h.step_id != mine.step_id) {
        problem = absl::StrCat(
            "worker ", Quoted(who), " is at step ", h.step_id, ", worker ",
            Quoted(plan_.ownership.worker_ids[0]), " at ", mine.step_id);
      } else if (h.hyper_hash != mine.hyper_hash) {
        problem = absl::StrCat(
            "the trainers of worker ", Quoted(who), " and worker ",
            Quoted(plan_.ownership.worker_ids[0]),
            " step with different lr, weight_decay or param groups");
      } else if (h.trainer_count != trainers_ || h.trainer_rank < 0 ||
                 h.trainer_rank >= trainers_ || seen[h.trainer_rank]) {
        problem = absl::StrCat(
            "every worker with a trainer needs exactly one trainer of ",
            trainers_, "; worker ", Quoted(who), " has trainer ",
            h.trainer_rank, " of ", h.trainer_count);
      } else {
        seen[h.trainer_rank] = true;
      }
    }
    decision.step_id = mine.step_id;
    decision.go = problem.empty() ? 1 : 0;
    CopyProblem(problem, decision.problem);
  } else if (trainer_ != nullptr) {
    MUONPS_RETURN_IF_ERROR(ThroughTransportMemory(
        &mine, sizeof(mine),
        [&](void* data) { return t_.Send(data, sizeof(mine), 0, stream_); }));
  }
  MUONPS_RETURN_IF_ERROR(
      ThroughTransportMemory(&decision, sizeof(decision), [&](void* data) {
        return t_.Broadcast(data, sizeof(decision), 0, stream_);
      }));
  step_id_ = decision.step_id;
  MUONPS_RETURN_IF_ERROR(ThroughTransportMemory(
      trainer_rank_of_.data(), sizeof(int32_t) * size, [&](void* data) {
        return t_.Broadcast(data, sizeof(int32_t) * size, 0, stream_);
      }));
  // Trainer order, then the ranks with no trainer (their parts are zeros,
  // added last: the sums keep the bits of the trainers' parts alone).
  reduce_order_.assign(size, 0);
  for (int r = 0; r < size; ++r) {
    // A permutation once agreed (rank 0 checked it); clamp before that.
    const int32_t trainer = trainer_rank_of_[r];
    if (trainer >= 0 && trainer < trainers_) reduce_order_[trainer] = r;
    if (r >= trainers_) reduce_order_[r] = r;
  }
  if (!decision.go) {
    decision.problem[kProblemBytes - 1] = 0;
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step_id_,
                     " rejected, nothing was changed: ", decision.problem));
  }
  if (plan_.ownership.dedicated > 0) {
    MUONPS_RETURN_IF_ERROR(ShareFollowerInfo());
  }
  return absl::OkStatus();
}

absl::Status StepRun::ShareFollowerInfo() {
  FollowerInfoHeader header{};
  std::vector<int64_t> values;
  if (plan_.rank == 0) {
    for (const auto& [name, b] : trainer_->adamw) {
      if (b.layout == scheduler::Layout::kUnreduced) {
        values.push_back(b.elements);
      }
    }
    header.adamw_count = static_cast<int64_t>(values.size());
    header.matrix_count = static_cast<int64_t>(plan_.matrices.size());
    for (const Binding& b : trainer_->matrices) values.push_back(b.full_param);
  }
  MUONPS_RETURN_IF_ERROR(
      ThroughTransportMemory(&header, sizeof(header), [&](void* data) {
        return t_.Broadcast(data, sizeof(header), 0, stream_);
      }));
  if (header.matrix_count != static_cast<int64_t>(plan_.matrices.size()) ||
      header.adamw_count < 0 || header.adamw_count > (int64_t{1} << 24)) {
    return absl::InternalError("rank 0 described another job");
  }
  values.resize(header.adamw_count + header.matrix_count);
  MUONPS_RETURN_IF_ERROR(ThroughTransportMemory(
      values.data(), values.size() * sizeof(int64_t), [&](void* data) {
        return t_.Broadcast(data, values.size() * sizeof(int64_t), 0, stream_);
      }));
  if (trainer_ != nullptr) return absl::OkStatus();
  follower_adamw_.assign(values.begin(), values.begin() + header.adamw_count);
  follower_full_param_.assign(values.begin() + header.adamw_count,
                              values.end());
  int64_t largest = 1;
  for (int64_t n : follower_adamw_) largest = std::max(largest, n);
  for (const scheduler::MatrixSpec& spec : plan_.matrices) {
    largest = std::max(largest, spec.rows * spec.cols);
  }
  if (plan_.zeros == nullptr || plan_.zeros->size() < largest) {
    // Zero-filled once: the parts this rank adds to every sum.
    MUONPS_ASSIGN_OR_RETURN(plan_.zeros, ops_.Allocate(largest, "zero parts"));
    MUONPS_ASSIGN_OR_RETURN(plan_.sink,
                            ops_.Allocate(largest, "received means"));
  }
  return absl::OkStatus();
}

bool StepRun::FullParam(int32_t matrix) const {
  return trainer_ != nullptr ? trainer_->matrices[matrix].full_param
                             : follower_full_param_[matrix] != 0;
}

absl::Status StepRun::ToOwners(const scheduler::Bucket& bucket) {
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const scheduler::Transfer& x : bucket.to_owners) {
    const scheduler::MatrixSpec& spec = plan_.matrices[x.item.matrix];
    const Binding* b =
        trainer_ == nullptr ? nullptr : &trainer_->matrices[x.item.matrix];
    const int64_t e = x.item.expert;
    const int64_t size = spec.rows * spec.cols;
    const bool mine = x.owner == plan_.rank;
    float* staged =
        mine ? plan_.SlotData(plan_.slots[x.item.matrix][e], false) : nullptr;
    if (x.kind == scheduler::TransferKind::kReduceToOwner) {
      const float* part =
          b == nullptr ? plan_.zeros->data() : b->grad + e * size;
      MUONPS_RETURN_IF_ERROR(
          t_.ReduceSum(part, staged, size, x.owner, reduce_order_, stream_));
      bytes_ += size * 4;
      continue;
    }
    if (x.kind == scheduler::TransferKind::kSendToOwner) {
      // The owner has no trainer: trainer 0's worker sends the gradient.
      const int source = reduce_order_[0];
      if (plan_.rank == source) {
        MUONPS_RETURN_IF_ERROR(
            t_.Send(b->grad + e * size, size * 4, x.owner, stream_));
        bytes_ += size * 4;
      } else if (mine) {
        MUONPS_RETURN_IF_ERROR(t_.Recv(staged, size * 4, source, stream_));
      }
      continue;
    }
    // kGatherToOwner: row ranges of every trainer onto the owner.
    if (!mine) {
      if (b == nullptr) continue;  // no trainer, no rows
      const auto [begin, end] = RowsOfTrainer(spec.rows, trainer_->rank);
      const int64_t local = (end - begin) * spec.cols;
      MUONPS_RETURN_IF_ERROR(
          t_.Send(b->grad + e * local, local * 4, x.owner, stream_));
      bytes_ += local * 4;
      continue;
    }
    for (int r = 0; r < t_.size(); ++r) {
      if (trainer_rank_of_[r] < 0) continue;  // no trainer, no rows
      const auto [rb, re] = RowsOfTrainer(spec.rows, trainer_rank_of_[r]);
      float* dst = staged + rb * spec.cols;
      const int64_t count = (re - rb) * spec.cols;
      if (r == plan_.rank) {
        MUONPS_RETURN_IF_ERROR(
            ops_.Copy(dst, b->grad + e * count, count, stream_));
      } else {
        MUONPS_RETURN_IF_ERROR(t_.Recv(dst, count * 4, r, stream_));
        bytes_ += count * 4;
      }
    }
  }
  return t_.GroupEnd();
}

absl::Status StepRun::Compute(ComputeBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  const kernels::MuonHyperparameters& h = plan_.muon;
  const int64_t size = batch.rows * batch.cols;
  const int64_t count = static_cast<int64_t>(batch.items.size());
  const kernels::MatrixStack grad{batch.staged->data(), count, batch.rows,
                                  batch.cols};
  const kernels::MatrixStack buf{batch.momentum->data(), count, batch.rows,
                                 batch.cols};
  for (size_t s = 0; s < batch.items.size(); ++s) {
    const scheduler::ItemRef& item = batch.items[s];
    const scheduler::MatrixSpec& spec = plan_.matrices[item.matrix];
    const kernels::MatrixStack update{grad.matrix(s), 1, batch.rows,
                                      batch.cols};
    const kernels::MatrixStack momentum{buf.matrix(s), 1, batch.rows,
                                        batch.cols};
    kernels::MatrixStack source = update;  // staged: reduced or gathered
    if (spec.layout == scheduler::Layout::kReplicated && trainer_ != nullptr) {
      // Momentum reads the trainer's gradient in place: no staging copy.
      source.data = trainer_->matrices[item.matrix].grad + item.expert * size;
    } else if (spec.layout == scheduler::Layout::kUnreduced) {
      // The mean, as DDP: the fp32 sum times the fp32 inverse.
      MUONPS_RETURN_IF_ERROR(ops_.Scale(
          update.data, size, 1.0f / static_cast<float>(trainers_), compute_));
    }
    // The update goes to the stack slot (it may alias a staged source).
    MUONPS_RETURN_IF_ERROR(kernels_.UpdateMomentum(
        source, momentum, h.momentum, h.nesterov, update, compute_));
  }
  batch.has_momentum.assign(batch.items.size(), true);
  kernels::NewtonSchulzOptions ns = h.ns;
  ns.algorithm = batch.algorithm;  // the plan's choice for this batch
  MUONPS_RETURN_IF_ERROR(kernels_.Orthogonalize(grad, grad, ns, compute_));
  ns_seconds_ += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status StepRun::FromOwners(const scheduler::Bucket& bucket,
                                 const v1::StepRequest& request) {
  const kernels::MuonHyperparameters& h = plan_.muon;
  for (const scheduler::Transfer& x : bucket.from_owners) {
    const scheduler::MatrixSpec& spec = plan_.matrices[x.item.matrix];
    const Binding* b =
        trainer_ == nullptr ? nullptr : &trainer_->matrices[x.item.matrix];
    double lr = request.lr() >= 0 ? request.lr() : h.lr;
    double wd =
        request.weight_decay() >= 0 ? request.weight_decay() : h.weight_decay;
    for (const v1::ParamGroup& g : request.groups()) {
      for (const std::string& name : g.matrices()) {
        if (name == spec.name) {
          lr = g.lr();
          wd = g.weight_decay();
        }
      }
    }
    // Step size from the whole matrix's shape, even for a row shard.
    const float decay = static_cast<float>(1.0 - lr * wd);
    const float scale = static_cast<float>(
        -kernels::AdjustedLr(lr, h.lr_adjustment, spec.rows, spec.cols));
    const int64_t size = spec.rows * spec.cols;
    const int64_t e = x.item.expert;
    const bool mine = x.owner == plan_.rank;
    float* update = mine ? plan_.SlotData(plan_.slots[x.item.matrix][e], false)
                         : plan_.scratch->data();
    int64_t count = size;  // of the update this rank applies
    int64_t first = 0;     // its first element in the lent parameter
    if (x.kind == scheduler::TransferKind::kScatterFromOwner &&
        !FullParam(x.item.matrix)) {
      if (mine) {
        for (int r = 0; r < t_.size(); ++r) {
          if (r == plan_.rank || trainer_rank_of_[r] < 0) continue;
          const auto [rb, re] = RowsOfTrainer(spec.rows, trainer_rank_of_[r]);
          MUONPS_RETURN_IF_ERROR(t_.Send(
              update + rb * spec.cols, (re - rb) * spec.cols * 4, r, stream_));
          bytes_ += (re - rb) * spec.cols * 4;
        }
      }
      if (b == nullptr) continue;  // no rows to apply here
      const auto [begin, end] = RowsOfTrainer(spec.rows, trainer_->rank);
      count = (end - begin) * spec.cols;
      first = e * count;
      if (mine) {
        update += begin * spec.cols;
      } else {
        MUONPS_RETURN_IF_ERROR(t_.Recv(update, count * 4, x.owner, stream_));
        bytes_ += count * 4;
      }
    } else {
      first = e * size;
      MUONPS_RETURN_IF_ERROR(t_.Broadcast(update, size * 4, x.owner, stream_));
      bytes_ += size * 4;
      if (b == nullptr) continue;  // no parameter here
    }
    MUONPS_RETURN_IF_ERROR(
        ops_.ApplyScaled(kernels::ElementsPast(b->param, b->dtype, first),
                         b->dtype, update, count, decay, scale, stream_));
  }
  return absl::OkStatus();
}

absl::Status StepRun::AverageAdamWGradients() {
  const float inverse = 1.0f / static_cast<float>(trainers_);
  if (trainer_ == nullptr) {  // zeros in, the means received and dropped
    for (const int64_t n : follower_adamw_) {
      MUONPS_RETURN_IF_ERROR(t_.ReduceSum(plan_.zeros->data(),
                                          plan_.sink->data(), n, 0,
                                          reduce_order_, stream_));
      MUONPS_RETURN_IF_ERROR(
          t_.Broadcast(plan_.sink->data(), n * 4, 0, stream_));
    }
    return absl::OkStatus();
  }
  for (const auto& [name, b] : trainer_->adamw) {
    if (b.layout != scheduler::Layout::kUnreduced) continue;
    MUONPS_RETURN_IF_ERROR(
        t_.ReduceSum(b.grad, b.grad, b.elements, 0, reduce_order_, stream_));
    if (plan_.rank == 0) {
      MUONPS_RETURN_IF_ERROR(ops_.Scale(b.grad, b.elements, inverse, stream_));
    }
    MUONPS_RETURN_IF_ERROR(t_.Broadcast(b.grad, b.elements * 4, 0, stream_));
    bytes_ += 2 * b.elements * 4;
    if (b.dtype != DType::kFloat32) {  // the mean, back into the lent buffer
      MUONPS_RETURN_IF_ERROR(
          ops_.FromFloat(b.lent_grad, b.dtype, b.grad, b.elements, stream_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::StepResponse> StepRun::Run(const v1::StepRequest& request) {
  if (trainer_ == nullptr) return RunWithTrainerReady(request);
  // The worker's stream waits for the trainer's gradients (CUDA: an event,
  // no host waits); whatever happens, the trainer's stream is released in
  // this stream's order once the step is done or refused.
  absl::StatusOr<v1::StepResponse> out =
      [&]() -> absl::StatusOr<v1::StepResponse> {
    // Memory that is no longer whole is not read (the step is refused
    // everywhere through Agree).
    intact_ = trainer_->buffers->CheckIntact();
    if (intact_.ok()) {
      MUONPS_RETURN_IF_ERROR(trainer_->buffers->WaitForTrainer(stream_));
      MUONPS_RETURN_IF_ERROR(WidenGradients());
    }
    return RunWithTrainerReady(request);
  }();
  const absl::Status signaled =
      trainer_->buffers->SignalTrainer(stream_, request.step_id());
  if (out.ok() && !signaled.ok()) return signaled;
  return out;
}

absl::StatusOr<v1::StepResponse> StepRun::RunWithTrainerReady(
    const v1::StepRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  MUONPS_RETURN_IF_ERROR(Agree(request));
  // The schedule's order: transfers on stream_, this worker's stacks on
  // compute_, each side waiting for the other only where it reads what the
  // other wrote (no host waits).
  bool computed = false;  // compute_ has work stream_ has not waited for
  for (const scheduler::Phase& phase : plan_.schedule.order) {
    switch (phase.kind) {
      case scheduler::PhaseKind::kToOwners:
        MUONPS_RETURN_IF_ERROR(ToOwners(plan_.schedule.buckets[phase.index]));
        break;
      case scheduler::PhaseKind::kCompute: {
        const int batch = plan_.batch_of_stack[phase.index];
        if (batch < 0) break;  // another worker's stack
        MUONPS_RETURN_IF_ERROR(ops_.Order(compute_, stream_));
        MUONPS_RETURN_IF_ERROR(Compute(plan_.batches[batch]));
        computed = true;
        break;
      }
      case scheduler::PhaseKind::kFromOwners:
        if (computed) {
          MUONPS_RETURN_IF_ERROR(ops_.Order(stream_, compute_));
          computed = false;
        }
        MUONPS_RETURN_IF_ERROR(
            FromOwners(plan_.schedule.buckets[phase.index], request));
        break;
    }
  }
  if (computed) MUONPS_RETURN_IF_ERROR(ops_.Order(stream_, compute_));
  MUONPS_RETURN_IF_ERROR(AverageAdamWGradients());
  // Done when the transport's work and the stream are: a lost peer fails
  // here within the timeout instead of hanging.
  MUONPS_RETURN_IF_ERROR(t_.Synchronize(stream_, timeout_));
  MUONPS_RETURN_IF_ERROR(ops_.Synchronize(stream_));
  v1::StepResponse out;
  out.set_step_id(step_id_);
  out.set_plan_version(plan_.version);
  out.set_seconds(SecondsSince(start));
  out.set_ns_seconds(ns_seconds_);
  out.set_bytes_moved(bytes_);
  return out;
}

}  // namespace worker
}  // namespace muonps
