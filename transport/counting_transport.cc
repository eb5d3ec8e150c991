#include "transport/counting_transport.h"

#include <utility>

namespace muonps {
namespace transport {
namespace {

// The bytes `count` elements of `dtype` take, for the byte counters.
double Bytes(size_t count, DType dtype) {
  return static_cast<double>(count) * static_cast<double>(DTypeSize(dtype));
}

}  // namespace

TransportCounters AddTransportCounters(MetricsRegistry* registry) {
  return {
      .sent = registry->AddCounter(
          "muonps_worker_transport_bytes_sent_total",
          "Bytes this worker sent to other workers over its data transport "
          "(tensors and step control), by operation; a collective counts "
          "this rank's share of a chain schedule.",
          {"op"}),
      .received = registry->AddCounter(
          "muonps_worker_transport_bytes_received_total",
          "Bytes this worker received from other workers over its data "
          "transport, by operation, counted as the sent bytes are.",
          {"op"}),
      .calls = registry->AddCounter(
          "muonps_worker_transport_calls_total",
          "Calls this worker made on its data transport, by operation.",
          {"op"}),
      .launches = registry->AddCounter(
          "muonps_worker_transport_launches_total",
          "What the data transport ran those calls as: one launch per "
          "group of calls (one NCCL group), one per call outside a group.",
          {}),
  };
}

CountingTransport::CountingTransport(std::unique_ptr<Transport> inner,
                                     TransportCounters counters)
    : owned_(std::move(inner)), inner_(owned_.get()), counters_(counters) {
  Transport* control = inner_->control();
  if (control != inner_) {
    TransportCounters messages = counters;
    messages.launches = nullptr;
    control_.reset(new CountingTransport(control, messages));
  }
}

CountingTransport::CountingTransport(Transport* inner,
                                     TransportCounters counters)
    : inner_(inner), counters_(counters) {}

absl::Status CountingTransport::GroupStart() {
  absl::Status status = inner_->GroupStart();
  if (status.ok()) ++depth_;
  return status;
}

absl::Status CountingTransport::GroupEnd() {
  absl::Status status = inner_->GroupEnd();
  // Closed either way: a failed GroupEnd leaves no group open.
  if (depth_ > 0 && --depth_ == 0 && group_calls_) {
    group_calls_ = false;
    if (status.ok()) Launched();
  }
  return status;
}

void CountingTransport::Launched() {
  if (counters_.launches != nullptr) counters_.launches->Increment();
}

void CountingTransport::Count(const char* op, size_t count, double sent,
                              double received) {
  if (count == 0) return;  // nothing to run
  if (counters_.calls != nullptr) counters_.calls->Increment({op});
  if (depth_ > 0) {
    group_calls_ = true;
  } else {
    Launched();
  }
  if (counters_.sent != nullptr && sent > 0) {
    counters_.sent->Increment({op}, sent);
  }
  if (counters_.received != nullptr && received > 0) {
    counters_.received->Increment({op}, received);
  }
}

absl::Status CountingTransport::Send(const void* data, size_t count,
                                     DType dtype, int peer, Stream stream) {
  absl::Status status = inner_->Send(data, count, dtype, peer, stream);
  if (status.ok()) Count("send", count, Bytes(count, dtype), 0);
  return status;
}

absl::Status CountingTransport::Recv(void* data, size_t count, DType dtype,
                                     int peer, Stream stream) {
  absl::Status status = inner_->Recv(data, count, dtype, peer, stream);
  if (status.ok()) Count("recv", count, 0, Bytes(count, dtype));
  return status;
}

void CountingTransport::CountReduce(size_t count, int n, int at, int root) {
  const double bytes = Bytes(count, DType::kFloat32);
  // The chain root+1 -> ... -> root: its first rank receives nothing, the
  // root sends nothing.
  Count("reduce", count, at != root ? bytes : 0,
        n > 1 && at != (root + 1) % n ? bytes : 0);
}

void CountingTransport::CountBroadcast(size_t count, DType dtype, int n, int at,
                                       int root) {
  const double bytes = Bytes(count, dtype);
  // The chain root -> ... -> root-1: its last rank forwards nothing.
  Count("broadcast", count, at != (root + n - 1) % n ? bytes : 0,
        at != root ? bytes : 0);
}

int CountingTransport::Members(Split split) const {
  const std::vector<int>& members = group(split);
  return members.empty() ? size() : static_cast<int>(members.size());
}

absl::Status CountingTransport::ReduceSum(const float* send, float* recv,
                                          size_t count, int root,
                                          absl::Span<const int> order,
                                          Stream stream) {
  absl::Status status =
      inner_->ReduceSum(send, recv, count, root, order, stream);
  if (status.ok()) CountReduce(count, size(), rank(), root);
  return status;
}

absl::Status CountingTransport::Broadcast(void* data, size_t count, DType dtype,
                                          int root, Stream stream) {
  absl::Status status = inner_->Broadcast(data, count, dtype, root, stream);
  if (status.ok()) CountBroadcast(count, dtype, size(), rank(), root);
  return status;
}

absl::Status CountingTransport::BroadcastIn(Split split, void* data,
                                            size_t count, DType dtype, int root,
                                            Stream stream) {
  absl::Status status =
      inner_->BroadcastIn(split, data, count, dtype, root, stream);
  if (status.ok()) {
    CountBroadcast(count, dtype, Members(split), PositionIn(split, rank()),
                   PositionIn(split, root));
  }
  return status;
}

absl::Status CountingTransport::ReduceSumIn(Split split, const float* send,
                                            float* recv, size_t count, int root,
                                            absl::Span<const int> order,
                                            Stream stream) {
  absl::Status status =
      inner_->ReduceSumIn(split, send, recv, count, root, order, stream);
  if (status.ok()) {
    CountReduce(count, Members(split), PositionIn(split, rank()),
                PositionIn(split, root));
  }
  return status;
}

}  // namespace transport
}  // namespace muonps
