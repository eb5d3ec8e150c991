#include "server/worker/row_relay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {
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
  const int64_t bytes =
      scheduler::RelayAligned(count * static_cast<int64_t>(DTypeSize(dtype)));
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
