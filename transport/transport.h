// Moving tensor bytes among the workers of one plan version: point-to-point
// sends and receives and the collectives a step needs, rooted at a matrix's
// owner. The TCP transport (this machine's CPU path) and the NCCL transport
// (GPUs) implement this one interface.
//
// Every rank issues the same calls in the same order (the step schedule
// fixes it); calls between GroupStart() and GroupEnd() may progress
// concurrently and complete at GroupEnd(), as with ncclGroupStart/End.
// Outside a group each call completes before it returns. A peer that
// disappears or stalls past the transport's timeout makes the pending call
// fail with UNAVAILABLE or DEADLINE_EXCEEDED naming the peer rank; the
// transport is then broken and must be rebuilt. A Transport is used by one
// thread at a time.
//
// Buffers handed to a call inside a group must stay valid, and those the
// call reads unchanged, until GroupEnd() returns; within one group no call
// may read what another writes. Messages between two ranks match up in call
// order, so both must issue their shared calls in the same order, grouped
// or not. Implementations: TcpTransport (tcp_transport.h).
#ifndef MUONPS_TRANSPORT_TRANSPORT_H_
#define MUONPS_TRANSPORT_TRANSPORT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace muonps {
namespace transport {

class Transport {
 public:
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;

  // `bytes` from `data` to `peer` (!= rank()).
  virtual absl::Status Send(const void* data, size_t bytes, int peer) = 0;
  // `bytes` from `peer` into `data`.
  virtual absl::Status Recv(void* data, size_t bytes, int peer) = 0;

  // Sum of every rank's `send` (count floats) into `recv` on `root`; `recv`
  // is ignored elsewhere and may alias `send` on the root. `order` is empty
  // (rank order) or a permutation of the ranks: the fp32 parts are added
  // left to right in that order, which fixes the result's bits (a caller
  // that wants results independent of how ranks were numbered passes its
  // own order; only the root's `order` matters). INVALID_ARGUMENT for an
  // `order` that is not a permutation.
  virtual absl::Status ReduceSum(const float* send, float* recv, size_t count,
                                 int root, absl::Span<const int> order) = 0;
  // `bytes` of `data` from `root` to every rank.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_TRANSPORT_H_
