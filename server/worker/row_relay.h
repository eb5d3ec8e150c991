// Row-sharded gradients and updates across nodes through relays, on one
// worker (scheduler/node_exchange.h, RelaysRows and RelayOf, says which
// rows go through which relay): each rank's rows to the owner or to its
// relay, and the relays' on to the owner; updates back the reverse way.
// The rows are copied, never added: the owner stages the same bits either
// way.
//
// Two launches: the first (in the caller's group, which must have ended
// before the second: a relay passes on what that group received) moves the
// rows to the owner or the relays, the second (Forward, a group of its
// own) the relays' rows on. Each relay keeps the rows of one first launch
// in its buffer, the ranks' rows one after another in rank order, item by
// item in the order given.
//
// Streams: every call is ordered on the one transfer stream given.
// Thread-compatible; used by the step's thread.
#ifndef MUONPS_SERVER_WORKER_ROW_RELAY_H_
#define MUONPS_SERVER_WORKER_ROW_RELAY_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/row_ranges.h"
#include "scheduler/node_exchange.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

class RowRelay {
 public:
  // The rows of trainer rank `trainer` of `spec`'s expert: what
  // StepStaging::PartOfExpert says.
  using PartOf = std::function<ExpertPart(const scheduler::MatrixSpec& spec,
                                          int64_t expert, int trainer)>;

  // `nodes`: the plan's exchange nodes, `at` their positions by rank;
  // `members`: this rank's owner group's ranks (every rank without
  // groups), among whom its transfers run; `trainer_rank_of`: by rank, its
  // trainer's rank (-1: none); `buffer` of `buffer_bytes` bytes: the
  // relay's (scheduler::ExchangeBuffers::relay). Everything must outlive
  // the relay.
  RowRelay(const std::vector<std::vector<int32_t>>& nodes,
           const std::vector<scheduler::NodePosition>& at, int rank,
           const std::vector<int32_t>& members,
           const std::vector<int32_t>& trainer_rank_of, PartOf part_of,
           transport::Transport& transport, void* buffer, int64_t buffer_bytes,
           Stream stream);

  // Inside the caller's group: this rank's calls of the first launch of
  // gathering expert `expert` of `spec` to `owner` (fp32): its own rows
  // (`rows`, null when it has none) to the owner or its relay; on a relay,
  // the rows it passes on; on the owner, the rows that come straight into
  // `staged` (the whole expert; its own rows are the caller's). Adds the
  // bytes this rank sent or received to `*bytes`.
  absl::Status Gather(const scheduler::MatrixSpec& spec, int64_t expert,
                      int owner, const float* rows, float* staged,
                      int64_t* bytes);
  // Inside the caller's group: the first launch of scattering the update
  // of `spec`'s expert (of `dtype`) from `owner`: on the owner, `update`
  // (the whole expert) to the ranks on its node or rail and to the relays;
  // on a relay, the rows it passes on; on a rank whose rows come straight,
  // into `landing` (its rows; null when it has none).
  absl::Status Scatter(const scheduler::MatrixSpec& spec, int64_t expert,
                       int owner, DType dtype, const void* update,
                       void* landing, int64_t* bytes);
  // The second launch, in a group of its own: the relays' rows of every
  // item since the last call on to their owners (gathers) or ranks
  // (scatters). Gather and Scatter fail FAILED_PRECONDITION naming the
  // buffer where a first launch's rows outgrow it.
  absl::Status Forward(int64_t* bytes);

 private:
  struct Pass {
    bool send = false;  // else receive
    int peer = 0;
    void* data = nullptr;
    int64_t count = 0;
    DType dtype = DType::kFloat32;
  };
  // A place in the buffer for `count` elements of `dtype`, or null.
  void* Take(int64_t count, DType dtype);
  // Each member but `owner` whose trainer holds rows of `spec`'s expert,
  // in member order: `visit(its part, elements, the member, its relay)`
  // (RelayOf: `owner` where the rows go straight); the first error.
  absl::Status ForEachSource(
      const scheduler::MatrixSpec& spec, int64_t expert, int owner,
      absl::FunctionRef<absl::Status(const ExpertPart& part, int64_t count,
                                     int source, int via)>
          visit);
  // On a relay: `count` elements of `dtype` from `from` received into the
  // buffer in the first launch, where they wait for the second.
  // FAILED_PRECONDITION naming `what` when they outgrow the buffer.
  absl::StatusOr<void*> Keep(int64_t count, DType dtype, int from,
                             absl::string_view what, int64_t* bytes);

  const std::vector<std::vector<int32_t>>& nodes_;
  const std::vector<scheduler::NodePosition>& at_;
  const int rank_;
  const std::vector<int32_t>& members_;
  const std::vector<int32_t>& trainer_rank_of_;
  const PartOf part_of_;
  transport::Transport& t_;
  char* const buffer_;
  const int64_t buffer_bytes_;
  const Stream stream_;
  int64_t used_ = 0;
  std::vector<Pass> second_;  // the second launch's calls, in order
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_ROW_RELAY_H_
