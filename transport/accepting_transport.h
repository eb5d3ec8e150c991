// Test support: a Transport that accepts every call and moves nothing. Its
// data calls answer `answer` (OK by default); tests override the calls
// they watch (an abort, a synchronize, where control messages go).
#ifndef MUONPS_TRANSPORT_ACCEPTING_TRANSPORT_H_
#define MUONPS_TRANSPORT_ACCEPTING_TRANSPORT_H_

#include <utility>

#include "absl/status/status.h"
#include "transport/transport.h"

namespace muonps {
namespace transport {

class AcceptingTransport : public Transport {
 public:
  AcceptingTransport(int rank, int size, absl::Status answer = {},
                     MemoryKind memory = MemoryKind::kHost)
      : rank_(rank), size_(size), answer_(std::move(answer)), memory_(memory) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory() const override { return memory_; }
  absl::Status GroupStart() override { return absl::OkStatus(); }
  absl::Status GroupEnd() override { return absl::OkStatus(); }
  absl::Status Send(const void*, size_t, DType, int, Stream) override {
    return answer_;
  }
  absl::Status Recv(void*, size_t, DType, int, Stream) override {
    return answer_;
  }
  absl::Status ReduceSum(const float*, float*, size_t, int,
                         absl::Span<const int>, Stream) override {
    return answer_;
  }
  absl::Status Broadcast(void*, size_t, DType, int, Stream) override {
    return answer_;
  }
  absl::Status ReduceSumIn(Split, const float*, float*, size_t, int,
                           absl::Span<const int>, Stream) override {
    return answer_;
  }
  absl::Status Synchronize(Stream, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::Status AwaitFrom(int, size_t, DType, absl::Duration) override {
    return absl::OkStatus();
  }
  void Abort(const absl::Status&) override {}

 private:
  const int rank_, size_;
  const absl::Status answer_;
  const MemoryKind memory_;
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_ACCEPTING_TRANSPORT_H_
