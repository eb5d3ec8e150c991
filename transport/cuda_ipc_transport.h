// CudaIpcTransport: device memory among the workers of one host by CUDA IPC
// peer copies, for workers that share a GPU (NCCL refuses two ranks on one
// GPU) or hosts without NCCL.
//
// Each rank owns a staging arena in its device memory, exported once (and
// again when it grows). A send copies its data into the arena on the
// caller's stream and, once the stream is there, tells the peer over a TCP
// control connection where it lies; the receiver copies it out of the
// sender's arena (an IPC mapping, opened once) into its buffer on its own
// stream and acknowledges; the sender's arena is reused only after every
// acknowledgement of the group. Collectives are sends and receives rooted
// at the owner: Broadcast sends to each rank, ReduceSum receives each part
// into a scratch buffer and adds them in fp32 in the caller's order (so
// results are bit-identical to the TCP transport's for the same order);
// BroadcastIn and ReduceSumIn do the same among the members of a split's
// group.
//
// Unlike NCCL, a call here (or a group, at GroupEnd) waits on the host for
// its stream and its peers before it returns; nothing on the GPU ever waits
// for another process, so a peer that dies is an UNAVAILABLE naming it,
// never a stuck stream. Thread rule: one thread uses it; Abort from any.
#ifndef MUONPS_TRANSPORT_CUDA_IPC_TRANSPORT_H_
#define MUONPS_TRANSPORT_CUDA_IPC_TRANSPORT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lending/cuda_ipc.h"
#include "transport/group_nesting.h"
#include "transport/tcp_transport.h"
#include "transport/transport.h"

namespace muonps {
namespace transport {

class CudaIpcTransport final : public Transport {
 public:
  // Wraps a connected control transport (host messages only) for CUDA
  // device `cuda_device`. INVALID_ARGUMENT for a null control transport.
  static absl::StatusOr<std::unique_ptr<CudaIpcTransport>> Create(
      int cuda_device, std::unique_ptr<TcpTransport> control);
  ~CudaIpcTransport() override;

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  MemoryKind memory() const override { return MemoryKind::kCuda; }

  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  // Counts are elements of `dtype`; the copies move count * DTypeSize(dtype)
  // bytes. INVALID_ARGUMENT (and broken) when that overflows.
  absl::Status Send(const void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  absl::Status ReduceSum(const float* send, float* recv, size_t count, int root,
                         absl::Span<const int> order, Stream stream) override;
  // ReduceSum's sends and receives among the members of this rank's group
  // of `split`, added in the same order.
  absl::Status ReduceSumIn(Split split, const float* send, float* recv,
                           size_t count, int root, absl::Span<const int> order,
                           Stream stream) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         Stream stream) override;
  // Waits for `stream` (bounded by `timeout`).
  absl::Status Synchronize(Stream stream, absl::Duration timeout) override;
  // Waits for the control message that starts every transfer; `count` and
  // `dtype` are not needed.
  absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                         absl::Duration timeout) override;
  void Abort(const absl::Status& reason) override;

 private:
  struct Op {
    enum class Kind { kSend, kRecv } kind;
    int peer;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
    Stream stream = kHostStream;
  };
  // A ReduceSum's (or ReduceSumIn's) root share: the other members' parts
  // land in scratch, summed at the end into `total` (a scratch of its own:
  // `out` may be the own part).
  struct PendingSum {
    std::vector<const float*> parts;  // in summation order; the root's: send
    float* total = nullptr;
    float* out = nullptr;
    size_t count = 0;
    Stream stream = kHostStream;
  };

  CudaIpcTransport(int cuda_device, std::unique_ptr<TcpTransport> control)
      : device_(cuda_device), control_(std::move(control)) {}
  // ReduceSum and ReduceSumIn among `members` (ascending, this rank among
  // them), `call` naming it in messages: the others send their parts to the
  // root, which adds them in the checked order.
  absl::Status Sum(absl::string_view call, const std::vector<int>& members,
                   const float* send, float* recv, size_t count, int root,
                   absl::Span<const int> order, Stream stream);
  absl::Status Run();  // the queued group
  absl::StatusOr<char*> Arena(size_t bytes);
  absl::StatusOr<float*> Scratch(size_t index, size_t bytes);
  absl::Status Fail(const absl::Status& status);

  const int device_;
  std::unique_ptr<TcpTransport> control_;
  GroupNesting group_;
  std::vector<Op> ops_;
  std::vector<PendingSum> sums_;
  absl::Status broken_;
  // Staging arena (exported) and receive-side scratch (private).
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  IpcMemoryRef arena_ref_;
  std::vector<std::pair<void*, size_t>> scratch_;
  IpcMemoryMap peers_;  // the peers' arenas
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_CUDA_IPC_TRANSPORT_H_
