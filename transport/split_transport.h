// SplitTransport: a device transport for the data (NCCL) with a host
// transport beside it for the control messages (TCP among the same ranks).
// A control message through NCCL is a kernel: launched from the host,
// spinning on SMs until its peer's arrives, and found done by polling the
// stream, which costs a step tenths of a millisecond each and slows the
// Newton-Schulz GEMMs beside it; over TCP it is a host write and read.
//
// Data calls go to the data transport; control() is the host one, and
// AwaitFrom (the message that opens a round) waits there. Abort breaks
// both. The two are built for the same ranks and plan version; a failure
// of either fails the step, and the caller rebuilds the pair.
#ifndef MUONPS_TRANSPORT_SPLIT_TRANSPORT_H_
#define MUONPS_TRANSPORT_SPLIT_TRANSPORT_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace muonps {
namespace transport {

class SplitTransport final : public Transport {
 public:
  // INVALID_ARGUMENT unless both are given, `control` is a host transport,
  // and both have the same rank and size.
  static absl::StatusOr<std::unique_ptr<SplitTransport>> Create(
      std::unique_ptr<Transport> data, std::unique_ptr<Transport> control);

  int rank() const override { return data_->rank(); }
  int size() const override { return data_->size(); }
  MemoryKind memory() const override { return data_->memory(); }
  absl::Status GroupStart() override { return data_->GroupStart(); }
  absl::Status GroupEnd() override { return data_->GroupEnd(); }
  absl::Status Send(const void* data, size_t count, DType dtype, int peer,
                    Stream stream) override {
    return data_->Send(data, count, dtype, peer, stream);
  }
  absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                    Stream stream) override {
    return data_->Recv(data, count, dtype, peer, stream);
  }
  absl::Status ReduceSum(const float* send, float* recv, size_t count, int root,
                         absl::Span<const int> order, Stream stream) override {
    return data_->ReduceSum(send, recv, count, root, order, stream);
  }
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         Stream stream) override {
    return data_->Broadcast(data, count, dtype, root, stream);
  }
  absl::Status BroadcastIn(Split split, void* data, size_t count, DType dtype,
                           int root, Stream stream) override {
    return data_->BroadcastIn(split, data, count, dtype, root, stream);
  }
  absl::Status ReduceSumIn(Split split, const float* send, float* recv,
                           size_t count, int root, absl::Span<const int> order,
                           Stream stream) override {
    return data_->ReduceSumIn(split, send, recv, count, root, order, stream);
  }
  absl::Status Synchronize(Stream stream, absl::Duration timeout) override {
    return data_->Synchronize(stream, timeout);
  }
  absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                         absl::Duration timeout) override {
    return control_->AwaitFrom(peer, count, dtype, timeout);
  }
  void Abort(const absl::Status& reason) override {
    control_->Abort(reason);
    data_->Abort(reason);
  }
  Transport* control() override { return control_.get(); }
  // The control transport's, which the control messages pass along.
  RankTree tree() const override { return control_->tree(); }

 protected:
  // The data's splits; control messages stay among every rank.
  absl::Status OnSplit(Split split, const std::vector<std::vector<int>>& groups,
                       int /*mine*/) override {
    return data_->FormSplit(split, groups);
  }

 private:
  SplitTransport(std::unique_ptr<Transport> data,
                 std::unique_ptr<Transport> control)
      : data_(std::move(data)), control_(std::move(control)) {}

  const std::unique_ptr<Transport> data_;
  const std::unique_ptr<Transport> control_;
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_SPLIT_TRANSPORT_H_
