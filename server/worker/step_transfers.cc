// StepRun's stage (step_run.h, 3.): the schedule's transfers and the owned
// stacks' compute. Nothing here writes what outlives the step uncommitted:
// new momentum goes to the batches' next_momentum, updates and AdamW means
// to the trainer's staging buffer, each recorded for CommitStaged.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "server/worker/step_run.h"

namespace muonps {
namespace worker {
namespace {

// What workers with no trainer learn from rank 0 before a step's
// transfers, as int64 values: the unreduced AdamW tensors' sizes (name
// order), then per job matrix whether its trainers keep the whole
// parameter of a row-sharded gradient (1) or not (0).
struct FollowerInfoHeader {
  int64_t adamw_count;
  int64_t matrix_count;
};

}  // namespace

std::pair<int64_t, int64_t> StepRun::RowsOfTrainer(int64_t rows,
                                                   int trainer) const {
  return TrainerRowRange(rows, trainer, trainers_);
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
  MUONPS_RETURN_IF_ERROR(control_.Broadcast(&header, 0));
  if (header.matrix_count != static_cast<int64_t>(plan_.matrices.size()) ||
      header.adamw_count < 0 || header.adamw_count > (int64_t{1} << 24)) {
    return absl::InternalError("rank 0 described another job");
  }
  values.resize(header.adamw_count + header.matrix_count);
  MUONPS_RETURN_IF_ERROR(
      control_.Broadcast(values.data(), values.size() * sizeof(int64_t), 0));
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
  const kernels::MuonHyperparameters& h = plan_.muon;
  const int64_t size = batch.rows * batch.cols;
  const int64_t count = static_cast<int64_t>(batch.items.size());
  const kernels::MatrixStack grad{batch.staged->data(), count, batch.rows,
                                  batch.cols};
  // The new momentum is written beside the old, which stays as it is until
  // the step commits.
  const kernels::MatrixStack old{batch.momentum->data(), count, batch.rows,
                                 batch.cols};
  const kernels::MatrixStack buf{batch.next_momentum->data(), count, batch.rows,
                                 batch.cols};
  for (size_t s = 0; s < batch.items.size(); ++s) {
    const scheduler::ItemRef& item = batch.items[s];
    const scheduler::MatrixSpec& spec = plan_.matrices[item.matrix];
    const kernels::MatrixStack update{grad.matrix(s), 1, batch.rows,
                                      batch.cols};
    const kernels::MatrixStack previous{old.matrix(s), 1, batch.rows,
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
        source, previous, momentum, h.momentum, h.nesterov, update, compute_));
  }
  batch.next_has_momentum.assign(batch.items.size(), true);
  batch.next_valid = true;
  // One call per chunk, each with the algorithm the plan chose for its part
  // (NS is per matrix: the results do not depend on the cut).
  kernels::NewtonSchulzOptions ns = h.ns;
  int64_t first = 0;
  for (const scheduler::StackChunk& chunk : batch.chunks) {
    ns.algorithm = chunk.algorithm;
    const kernels::MatrixStack part{grad.matrix(first), chunk.count, batch.rows,
                                    batch.cols};
    MUONPS_RETURN_IF_ERROR(kernels_.Orthogonalize(part, part, ns, compute_));
    first += chunk.count;
  }
  return absl::OkStatus();
}

absl::Status StepRun::FromOwners(const scheduler::Bucket& bucket,
                                 const StepRequest& request) {
  const kernels::MuonHyperparameters& h = plan_.muon;
  for (const scheduler::Transfer& x : bucket.from_owners) {
    const scheduler::MatrixSpec& spec = plan_.matrices[x.item.matrix];
    const Binding* b =
        trainer_ == nullptr ? nullptr : &trainer_->matrices[x.item.matrix];
    // The step's values, its group's where given (by index, attached once).
    double lr = request.lr >= 0 ? request.lr : h.lr;
    double wd =
        request.weight_decay >= 0 ? request.weight_decay : h.weight_decay;
    if (b != nullptr && b->group >= 0 &&
        b->group < static_cast<int>(request.groups.size())) {
      const GroupHyperparameters& g = request.groups[b->group];
      if (g.lr >= 0) lr = g.lr;
      if (g.weight_decay >= 0) wd = g.weight_decay;
    }
    const int64_t size = spec.rows * spec.cols;
    const int64_t e = x.item.expert;
    const bool mine = x.owner == plan_.rank;
    float* const slot =
        mine ? plan_.SlotData(plan_.slots[x.item.matrix][e], false) : nullptr;
    ParamApply apply;
    apply.matrix = x.item.matrix;
    // Step size from the whole matrix's shape, even for a row shard.
    apply.decay = static_cast<float>(1.0 - lr * wd);
    apply.step = static_cast<float>(
        -kernels::AdjustedLr(lr, h.lr_adjustment, spec.rows, spec.cols));
    if (x.kind == scheduler::TransferKind::kScatterFromOwner &&
        !FullParam(x.item.matrix)) {
      if (mine) {
        for (int r = 0; r < t_.size(); ++r) {
          if (r == plan_.rank || trainer_rank_of_[r] < 0) continue;
          const auto [rb, re] = RowsOfTrainer(spec.rows, trainer_rank_of_[r]);
          MUONPS_RETURN_IF_ERROR(t_.Send(
              slot + rb * spec.cols, (re - rb) * spec.cols * 4, r, stream_));
          bytes_ += (re - rb) * spec.cols * 4;
        }
      }
      if (b == nullptr) continue;  // no rows to apply here
      const auto [begin, end] = RowsOfTrainer(spec.rows, trainer_->rank);
      apply.count = (end - begin) * spec.cols;
      apply.first = e * apply.count;
      apply.staged_at = b->staged_at + apply.first;
      float* staged = trainer_->staging->data() + apply.staged_at;
      if (mine) {
        MUONPS_RETURN_IF_ERROR(
            ops_.Copy(staged, slot + begin * spec.cols, apply.count, stream_));
      } else {
        MUONPS_RETURN_IF_ERROR(
            t_.Recv(staged, apply.count * 4, x.owner, stream_));
        bytes_ += apply.count * 4;
      }
    } else {
      bytes_ += size * 4;
      if (b == nullptr) {  // no parameter here: only the owner's part
        float* update = mine ? slot : plan_.scratch->data();
        MUONPS_RETURN_IF_ERROR(
            t_.Broadcast(update, size * 4, x.owner, stream_));
        continue;
      }
      apply.count = size;
      apply.first = e * size;
      apply.staged_at = b->staged_at + apply.first;
      float* staged = trainer_->staging->data() + apply.staged_at;
      if (mine) MUONPS_RETURN_IF_ERROR(ops_.Copy(staged, slot, size, stream_));
      MUONPS_RETURN_IF_ERROR(t_.Broadcast(staged, size * 4, x.owner, stream_));
    }
    ledger_.staged.applies.push_back(apply);
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
  for (size_t i = 0; i < trainer_->adamw.size(); ++i) {
    const Binding& b = trainer_->adamw[i].second;
    if (b.layout != scheduler::Layout::kUnreduced) continue;
    // The mean waits in the staging until the step commits.
    float* mean = trainer_->staging->data() + b.staged_at;
    MUONPS_RETURN_IF_ERROR(
        t_.ReduceSum(b.grad, mean, b.elements, 0, reduce_order_, stream_));
    if (plan_.rank == 0) {
      MUONPS_RETURN_IF_ERROR(ops_.Scale(mean, b.elements, inverse, stream_));
    }
    MUONPS_RETURN_IF_ERROR(t_.Broadcast(mean, b.elements * 4, 0, stream_));
    bytes_ += 2 * b.elements * 4;
    ledger_.staged.means.push_back(static_cast<int>(i));
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
