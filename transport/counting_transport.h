// CountingTransport: a Transport that forwards every call to another one and
// counts the bytes this rank sends and receives through it, the calls, and
// the launches they take, into Prometheus counters (the first three
// labelled by operation: send, recv, reduce, broadcast). The one place a
// worker's step traffic (tensors and control messages alike) is measured,
// whatever transport carries it.
//
// What a collective counts is the share of one rank in a chain (ring)
// schedule, the way NCCL runs a rooted collective and the way the bytes of
// a ring all-reduce are usually counted: for ReduceSum of S bytes the chain
// runs root+1 -> root+2 -> ... -> root, so every rank but the root sends S
// and every rank but root+1 receives S; for Broadcast of S bytes it runs
// root -> root+1 -> ... -> root-1, so every rank but root-1 sends S and
// every rank but the root receives S (ranks mod size). Whatever tree or
// ring the library picks, the totals over the ranks are the same ((size-1)
// S each way); only which rank forwards may differ. With two ranks every
// figure is exact. ReduceSumIn and BroadcastIn count as ReduceSum and
// Broadcast (ops reduce and broadcast) over the members of this rank's group
// of their split, a chain over the group's positions (its members in
// ascending rank order) from the root's; before the split is formed, over
// every rank. Send and Recv count their bytes. Calls name counts of
// elements; the counters stay in bytes (count * DTypeSize(dtype), fp32 for
// ReduceSum and ReduceSumIn). A call counts once it was accepted (returned
// OK), when it is enqueued, not when it completes.
//
// Launches: what the library runs the calls as, one per outermost group
// that holds a call (GroupStart ... GroupEnd: one NCCL launch), and one per
// call outside any group. Each launch costs the host tens of microseconds
// with NCCL, whatever it moves: a step's launches are its fixed cost.
//
// A transport whose control messages go beside it (Transport::control())
// has them counted by a CountingTransport of their own: bytes and calls,
// no launches (a host transport launches nothing on the device).
//
// Thread-compatible like the Transport it wraps (one thread at a time);
// Abort() may be called from any thread. The counters must outlive it.
#ifndef MUONPS_TRANSPORT_COUNTING_TRANSPORT_H_
#define MUONPS_TRANSPORT_COUNTING_TRANSPORT_H_

#include <memory>
#include <vector>

#include "common/metrics.h"
#include "transport/transport.h"

namespace muonps {
namespace transport {

// The counters: `sent`, `received` (bytes) and `calls` with one label, "op"
// (send, recv, reduce, broadcast); `launches` with none. Any may be null
// (not counted).
struct TransportCounters {
  Counter* sent = nullptr;
  Counter* received = nullptr;
  Counter* calls = nullptr;
  Counter* launches = nullptr;
};

// Registers muonps_worker_transport_bytes_sent_total,
// muonps_worker_transport_bytes_received_total,
// muonps_worker_transport_calls_total and
// muonps_worker_transport_launches_total in `registry`.
TransportCounters AddTransportCounters(MetricsRegistry* registry);

class CountingTransport : public Transport {
 public:
  CountingTransport(std::unique_ptr<Transport> inner,
                    TransportCounters counters);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  MemoryKind memory() const override { return inner_->memory(); }
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  // Counted in bytes: count * DTypeSize(dtype).
  absl::Status Send(const void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  absl::Status ReduceSum(const float* send, float* recv, size_t count, int root,
                         absl::Span<const int> order, Stream stream) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         Stream stream) override;
  // Counted as Broadcast and ReduceSum are, over the members of this
  // rank's group of `split` (see the file comment).
  absl::Status BroadcastIn(Split split, void* data, size_t count, DType dtype,
                           int root, Stream stream) override;
  absl::Status ReduceSumIn(Split split, const float* send, float* recv,
                           size_t count, int root, absl::Span<const int> order,
                           Stream stream) override;
  absl::Status Synchronize(Stream stream, absl::Duration timeout) override {
    return inner_->Synchronize(stream, timeout);
  }
  absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                         absl::Duration timeout) override {
    return inner_->AwaitFrom(peer, count, dtype, timeout);
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  Transport* control() override {
    return control_ != nullptr ? control_.get() : this;
  }
  RankTree tree() const override { return inner_->tree(); }

 protected:
  absl::Status OnSplit(Split split, const std::vector<std::vector<int>>& groups,
                       int /*mine*/) override {
    return inner_->FormSplit(split, groups);
  }

 private:
  // Counts what `inner` (owned by another transport) carries.
  CountingTransport(Transport* inner, TransportCounters counters);
  // An accepted call of `count` elements.
  void Count(const char* op, size_t count, double sent, double received);
  // An accepted ReduceSum of `count` floats among `n` ranks at positions
  // [0, n), this one at `at`, to the one at `root`: its share of the chain.
  void CountReduce(size_t count, int n, int at, int root);
  // An accepted Broadcast of `count` elements of `dtype`, likewise.
  void CountBroadcast(size_t count, DType dtype, int n, int at, int root);
  // How many ranks a call on `split` runs among (every rank until formed).
  int Members(Split split) const;
  void Launched();

  const std::unique_ptr<Transport> owned_;  // null: `inner_` is not ours
  Transport* const inner_;
  const TransportCounters counters_;
  std::unique_ptr<CountingTransport> control_;  // null: control() is this
  int depth_ = 0;                               // open groups
  bool group_calls_ = false;  // the outermost open group holds a call
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_COUNTING_TRANSPORT_H_
