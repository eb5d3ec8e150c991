#include "server/worker/row_relay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {
namespace {

// Each relayed part starts this aligned in the buffer.
constexpr int64_t kAlignment = 256;

int64_t Aligned(int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace

int64_t RelayElements(const scheduler::StepSchedule& schedule,
                      const std::vector<scheduler::MatrixSpec>& matrices,
                      int rank, int32_t group,
                      const std::vector<int32_t>& members, int shards,
                      int update_bytes) {
  const std::vector<std::vector<int32_t>>& nodes = schedule.exchange_nodes;
  if (nodes.empty() || rank < 0 || shards < 1) return 1;
  const std::vector<scheduler::NodePosition> at = scheduler::PositionsOf(nodes);
  if (rank >= static_cast<int>(at.size())) return 1;
  // Bytes of the rows `x` relays through `rank`: every member's at most one
  // shard of the rows.
  const auto relayed = [&](const scheduler::Transfer& x, int width) {
    const scheduler::MatrixSpec& spec = matrices[x.item.matrix];
    if (x.group != group || !scheduler::RelaysRows(nodes, spec) ||
        rank == x.owner) {
      return int64_t{0};
    }
    const int64_t chunk = (spec.rows + shards - 1) / shards;
    int64_t bytes = 0;
    for (const int32_t r : members) {
      if (r == x.owner || scheduler::RelayOf(nodes, at, r, x.owner) != rank) {
        continue;
      }
      bytes += Aligned(chunk * spec.cols * width);
    }
    return bytes;
  };
  // A bucket's gradients go in a group of their own; a run of
  // updates-back phases (consecutive in the order) in one.
  int64_t most = 0, run = 0;
  for (const scheduler::Phase& phase : schedule.order) {
    if (phase.kind != scheduler::PhaseKind::kFromOwners) run = 0;
    if (phase.kind == scheduler::PhaseKind::kToOwners) {
      int64_t in = 0;
      for (const scheduler::Transfer& x :
           schedule.buckets[phase.index].to_owners) {
        if (x.kind == scheduler::TransferKind::kGatherToOwner) {
          in += relayed(x, 4);
        }
      }
      most = std::max(most, in);
    } else if (phase.kind == scheduler::PhaseKind::kFromOwners) {
      for (const scheduler::Transfer& x :
           schedule.buckets[phase.index].from_owners) {
        if (x.kind == scheduler::TransferKind::kScatterFromOwner) {
          run += relayed(x, update_bytes);
        }
      }
      most = std::max(most, run);
    }
  }
  return std::max<int64_t>(1, (most + 3) / 4);
}

RowRelay::RowRelay(const std::vector<std::vector<int32_t>>& nodes,
                   const std::vector<scheduler::NodePosition>& at, int rank,
                   const std::vector<int32_t>& members,
                   const std::vector<int32_t>& trainer_rank_of, PartOf part_of,
                   transport::Transport& transport, void* buffer,
                   int64_t buffer_bytes, Stream stream)
    : nodes_(nodes),
      at_(at),
      rank_(rank),
      members_(members),
      trainer_rank_of_(trainer_rank_of),
      part_of_(std::move(part_of)),
      t_(transport),
      buffer_(static_cast<char*>(buffer)),
      buffer_bytes_(buffer_bytes),
      stream_(stream) {}

void* RowRelay::Take(int64_t count, DType dtype) {
  const int64_t bytes = Aligned(count * static_cast<int64_t>(DTypeSize(dtype)));
  if (buffer_ == nullptr || used_ + bytes > buffer_bytes_) return nullptr;
  void* at = buffer_ + used_;
  used_ += bytes;
  return at;
}

absl::Status RowRelay::ForEachSource(
    const scheduler::MatrixSpec& spec, int64_t expert, int owner,
    absl::FunctionRef<absl::Status(const ExpertPart& part, int64_t count,
                                   int source, int via)>
        visit) {
  for (const int r : members_) {
    if (r == owner || trainer_rank_of_[r] < 0) continue;
    const ExpertPart part = part_of_(spec, expert, trainer_rank_of_[r]);
    const int64_t count = part.rows() * spec.cols;
    if (count == 0) continue;
    MUONPS_RETURN_IF_ERROR(
        visit(part, count, r, scheduler::RelayOf(nodes_, at_, r, owner)));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> RowRelay::Keep(int64_t count, DType dtype, int from,
                                     absl::string_view what, int64_t* bytes) {
  void* kept = Take(count, dtype);
  if (kept == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "relay buffer of ", buffer_bytes_, " bytes: ", what, " outgrow it"));
  }
  MUONPS_RETURN_IF_ERROR(t_.Recv(kept, count, dtype, from, stream_));
  *bytes += count * static_cast<int64_t>(DTypeSize(dtype));
  return kept;
}

absl::Status RowRelay::Gather(const scheduler::MatrixSpec& spec, int64_t expert,
                              int owner, const float* rows, float* staged,
                              int64_t* bytes) {
  return ForEachSource(
      spec, expert, owner,
      [&](const ExpertPart& part, int64_t count, int r,
          int via) -> absl::Status {
        if (rank_ == r) {
          if (rows == nullptr) {
            return absl::InternalError(absl::StrCat("relayed rows of ",
                                                    spec.name, ": rank ", r,
                                                    " has none to send"));
          }
          MUONPS_RETURN_IF_ERROR(
              t_.Send(rows, count, DType::kFloat32, via, stream_));
          *bytes += count * 4;
        } else if (rank_ == owner) {
          float* dst = staged + part.row_begin * spec.cols;
          if (via != owner) {
            second_.push_back({false, via, dst, count, DType::kFloat32});
            return absl::OkStatus();
          }
          MUONPS_RETURN_IF_ERROR(
              t_.Recv(dst, count, DType::kFloat32, r, stream_));
          *bytes += count * 4;
        } else if (rank_ == via) {
          MUONPS_ASSIGN_OR_RETURN(
              void* kept,
              Keep(count, DType::kFloat32, r,
                   absl::StrCat("the rows of ", spec.name, " from rank ", r),
                   bytes));
          second_.push_back({true, owner, kept, count, DType::kFloat32});
        }
        return absl::OkStatus();
      });
}

absl::Status RowRelay::Scatter(const scheduler::MatrixSpec& spec,
                               int64_t expert, int owner, DType dtype,
                               const void* update, void* landing,
                               int64_t* bytes) {
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
  return ForEachSource(
      spec, expert, owner,
      [&](const ExpertPart& part, int64_t count, int r,
          int via) -> absl::Status {
        if (rank_ == owner) {
          MUONPS_RETURN_IF_ERROR(t_.Send(static_cast<const char*>(update) +
                                             part.row_begin * spec.cols * width,
                                         count, dtype, via == owner ? r : via,
                                         stream_));
          *bytes += count * width;
        } else if (rank_ == r) {
          if (landing == nullptr) {
            return absl::InternalError(absl::StrCat("relayed update of ",
                                                    spec.name, ": rank ", r,
                                                    " has nowhere to land it"));
          }
          if (via != owner) {
            second_.push_back({false, via, landing, count, dtype});
            return absl::OkStatus();
          }
          MUONPS_RETURN_IF_ERROR(
              t_.Recv(landing, count, dtype, owner, stream_));
          *bytes += count * width;
        } else if (rank_ == via) {
          MUONPS_ASSIGN_OR_RETURN(
              void* kept,
              Keep(count, dtype, owner,
                   absl::StrCat("the update of ", spec.name, " for rank ", r),
                   bytes));
          second_.push_back({true, r, kept, count, dtype});
        }
        return absl::OkStatus();
      });
}

absl::Status RowRelay::Forward(int64_t* bytes) {
  if (second_.empty()) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const Pass& p : second_) {
    if (p.send) {
      MUONPS_RETURN_IF_ERROR(
          t_.Send(p.data, p.count, p.dtype, p.peer, stream_));
    } else {
      MUONPS_RETURN_IF_ERROR(
          t_.Recv(p.data, p.count, p.dtype, p.peer, stream_));
    }
    *bytes += p.count * static_cast<int64_t>(DTypeSize(p.dtype));
  }
  second_.clear();
  used_ = 0;
  return t_.GroupEnd();
}

}  // namespace worker
}  // namespace muonps
