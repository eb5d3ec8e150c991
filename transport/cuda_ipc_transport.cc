#include "transport/cuda_ipc_transport.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "transport/ipc_add.h"

namespace muonps {
namespace transport {
namespace {

constexpr size_t kAlign = 256;

// Where a sent message lies in the sender's arena.
struct Descriptor {
  char handle[kCudaIpcHandleBytes];
  uint64_t offset;
  uint64_t bytes;
};

// Control messages travel over the TCP transport as fp32 elements.
static_assert(sizeof(Descriptor) % sizeof(float) == 0,
              "a Descriptor travels as whole floats");
constexpr size_t kDescriptorFloats = sizeof(Descriptor) / sizeof(float);
// The acknowledgement: one uint32_t, one fp32 element.
static_assert(sizeof(uint32_t) == sizeof(float), "an ack is one float");

// count * DTypeSize(dtype), or INVALID_ARGUMENT naming `call` when that
// does not fit a size_t.
absl::StatusOr<size_t> BytesOf(const char* call, size_t count, DType dtype) {
  const size_t element = DTypeSize(dtype);
  if (count > std::numeric_limits<size_t>::max() / element) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": count ", count, " of ", DTypeName(dtype), " is too large"));
  }
  return count * element;
}

cudaStream_t AsCuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcTransport>> CudaIpcTransport::Create(
    int cuda_device, std::unique_ptr<TcpTransport> control) {
  if (control == nullptr) return InvalidField("control", "is null");
  int count = 0;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (cuda_device < 0 || cuda_device >= count) {
    return InvalidField("cuda_device",
                        absl::StrCat(cuda_device, " of ", count, " devices"));
  }
  return std::unique_ptr<CudaIpcTransport>(
      new CudaIpcTransport(cuda_device, std::move(control)));
}

CudaIpcTransport::~CudaIpcTransport() {
  cudaSetDevice(device_);
  if (arena_ != nullptr) cudaFree(arena_);
  for (auto& [p, bytes] : scratch_) cudaFree(p);
}

absl::Status CudaIpcTransport::Fail(const absl::Status& status) {
  if (broken_.ok()) {
    broken_ = Annotate(
        status, absl::StrCat("CUDA IPC transport rank ", control_->rank()));
  }
  ops_.clear();
  sums_.clear();
  group_.Reset();
  return broken_;
}

void CudaIpcTransport::Abort(const absl::Status& reason) {
  control_->Abort(reason);
}

absl::StatusOr<char*> CudaIpcTransport::Arena(size_t bytes) {
  if (bytes > arena_bytes_) {
    if (arena_ != nullptr) cudaFree(arena_);
    arena_ = nullptr;
    arena_bytes_ = 0;
    const size_t grown = std::max(bytes, size_t{64} << 20);
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&arena_, grown), "staging arena"));
    arena_bytes_ = grown;
    MUONPS_ASSIGN_OR_RETURN(arena_ref_, ExportDeviceMemory(arena_, grown));
  }
  return static_cast<char*>(arena_);
}

absl::StatusOr<float*> CudaIpcTransport::Scratch(size_t index, size_t bytes) {
  if (scratch_.size() <= index) scratch_.resize(index + 1, {nullptr, 0});
  auto& [p, have] = scratch_[index];
  if (have < bytes) {
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    have = 0;
    MUONPS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "reduce scratch"));
    have = bytes;
  }
  return static_cast<float*>(p);
}

absl::Status CudaIpcTransport::GroupStart() {
  if (!broken_.ok()) return broken_;
  group_.Start();
  return absl::OkStatus();
}

absl::Status CudaIpcTransport::GroupEnd() {
  if (!broken_.ok()) return broken_;
  const absl::StatusOr<bool> outermost = group_.End();
  if (!outermost.ok()) return Fail(outermost.status());
  if (!*outermost) return absl::OkStatus();
  const absl::Status ran = Run();
  return ran.ok() ? ran : Fail(ran);
}

absl::Status CudaIpcTransport::Send(const void* data, size_t count, DType dtype,
                                    int peer, Stream stream) {
  if (!broken_.ok()) return broken_;
  if (peer < 0 || peer >= size() || peer == rank()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "Send: peer ", peer, " of ", size(), " (self: ", rank(), ")")));
  }
  const absl::StatusOr<size_t> bytes = BytesOf("Send", count, dtype);
  if (!bytes.ok()) return Fail(bytes.status());
  ops_.push_back({Op::Kind::kSend, peer, data, nullptr, *bytes, stream});
  if (group_.grouped()) return absl::OkStatus();
  const absl::Status ran = Run();
  return ran.ok() ? ran : Fail(ran);
}

absl::Status CudaIpcTransport::Recv(void* data, size_t count, DType dtype,
                                    int peer, Stream stream) {
  if (!broken_.ok()) return broken_;
  if (peer < 0 || peer >= size() || peer == rank()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "Recv: peer ", peer, " of ", size(), " (self: ", rank(), ")")));
  }
  const absl::StatusOr<size_t> bytes = BytesOf("Recv", count, dtype);
  if (!bytes.ok()) return Fail(bytes.status());
  ops_.push_back({Op::Kind::kRecv, peer, nullptr, data, *bytes, stream});
  if (group_.grouped()) return absl::OkStatus();
  const absl::Status ran = Run();
  return ran.ok() ? ran : Fail(ran);
}

absl::Status CudaIpcTransport::Broadcast(void* data, size_t count, DType dtype,
                                         int root, Stream stream) {
  if (!broken_.ok()) return broken_;
  if (root < 0 || root >= size()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " of ", size())));
  }
  const absl::StatusOr<size_t> bytes = BytesOf("Broadcast", count, dtype);
  if (!bytes.ok()) return Fail(bytes.status());
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    if (rank() == root) {
      ops_.push_back({Op::Kind::kSend, r, data, nullptr, *bytes, stream});
    } else if (r == root) {
      ops_.push_back({Op::Kind::kRecv, r, nullptr, data, *bytes, stream});
    }
  }
  if (group_.grouped()) return absl::OkStatus();
  const absl::Status ran = Run();
  return ran.ok() ? ran : Fail(ran);
}

absl::Status CudaIpcTransport::ReduceSum(const float* send, float* recv,
                                         size_t count, int root,
                                         absl::Span<const int> order,
                                         Stream stream) {
  return Sum("ReduceSum", EveryRank(), send, recv, count, root, order, stream);
}

absl::Status CudaIpcTransport::ReduceSumIn(Split split, const float* send,
                                           float* recv, size_t count, int root,
                                           absl::Span<const int> order,
                                           Stream stream) {
  return Sum(CallIn("ReduceSumIn", split), MembersOf(split), send, recv, count,
             root, order, stream);
}

absl::Status CudaIpcTransport::Sum(absl::string_view call,
                                   const std::vector<int>& members,
                                   const float* send, float* recv, size_t count,
                                   int root, absl::Span<const int> order,
                                   Stream stream) {
  if (!broken_.ok()) return broken_;
  absl::StatusOr<std::vector<int>> sum_order =
      CheckSum(call, members, send, recv, count, root, order);
  if (!sum_order.ok()) return Fail(sum_order.status());
  const size_t bytes = count * sizeof(float);
  if (rank() != root) {
    ops_.push_back({Op::Kind::kSend, root, send, nullptr, bytes, stream});
  } else {
    PendingSum sum;
    sum.out = recv;
    sum.count = count;
    sum.stream = stream;
    // This sum's scratch slots follow those of the group's earlier sums
    // (each takes one per part but its own, and one for the total).
    size_t slot = 0;
    for (const PendingSum& earlier : sums_) slot += earlier.parts.size();
    for (const int member : *sum_order) {
      if (member == rank()) {
        sum.parts.push_back(send);
        continue;
      }
      MUONPS_ASSIGN_OR_RETURN(float* part, Scratch(slot++, bytes));
      sum.parts.push_back(part);
      ops_.push_back({Op::Kind::kRecv, member, nullptr, part, bytes, stream});
    }
    MUONPS_ASSIGN_OR_RETURN(sum.total, Scratch(slot, bytes));
    sums_.push_back(std::move(sum));
  }
  if (group_.grouped()) return absl::OkStatus();
  const absl::Status ran = Run();
  return ran.ok() ? ran : Fail(ran);
}

absl::Status CudaIpcTransport::Run() {
  std::vector<Op> ops = std::move(ops_);
  std::vector<PendingSum> sums = std::move(sums_);
  ops_.clear();
  sums_.clear();
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  // 1. Sends: stage every payload in the arena, then describe it.
  size_t total = 0;
  std::vector<size_t> offsets(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != Op::Kind::kSend) continue;
    offsets[i] = total;
    total += (ops[i].bytes + kAlign - 1) / kAlign * kAlign;
  }
  std::set<Stream> streams;
  if (total > 0) {
    MUONPS_ASSIGN_OR_RETURN(char* arena, Arena(total));
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != Op::Kind::kSend || ops[i].bytes == 0) continue;
      MUONPS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(arena + offsets[i], ops[i].send, ops[i].bytes,
                          cudaMemcpyDeviceToDevice, AsCuda(ops[i].stream)),
          "staging a send"));
      streams.insert(ops[i].stream);
    }
  }
  for (Stream s : streams) {
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(AsCuda(s)), "staging a send"));
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != Op::Kind::kSend) continue;
    Descriptor d{};
    std::memcpy(d.handle, arena_ref_.handle.data(),
                std::min(arena_ref_.handle.size(), sizeof(d.handle)));
    d.offset = arena_ref_.offset + offsets[i];
    d.bytes = ops[i].bytes;
    MUONPS_RETURN_IF_ERROR(control_->Send(
        &d, kDescriptorFloats, DType::kFloat32, ops[i].peer, kHostStream));
  }
  // 2. Receives: copy each payload out of its sender's arena, then ack.
  streams.clear();
  for (const Op& op : ops) {
    if (op.kind != Op::Kind::kRecv) continue;
    Descriptor d{};
    MUONPS_RETURN_IF_ERROR(control_->Recv(
        &d, kDescriptorFloats, DType::kFloat32, op.peer, kHostStream));
    if (d.bytes != op.bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", op.peer, " sent ", d.bytes, " bytes; rank ",
                       rank(), " expected ", op.bytes));
    }
    if (op.bytes == 0) continue;
    IpcMemoryRef ref;
    ref.handle.assign(d.handle, sizeof(d.handle));
    ref.offset = d.offset;
    ref.bytes = d.bytes;
    ref.device = device_;
    absl::StatusOr<void*> source = peers_.Open(ref);
    if (!source.ok()) {
      return Annotate(source.status(),
                      absl::StrCat("rank ", op.peer, "'s staging arena"));
    }
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(op.recv, *source, op.bytes,
                                   cudaMemcpyDeviceToDevice, AsCuda(op.stream)),
                   "copying from a peer"));
    streams.insert(op.stream);
  }
  for (Stream s : streams) {
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(AsCuda(s)), "copying from a peer"));
  }
  const uint32_t ack = 1;
  for (const Op& op : ops) {
    if (op.kind != Op::Kind::kRecv) continue;
    MUONPS_RETURN_IF_ERROR(
        control_->Send(&ack, 1, DType::kFloat32, op.peer, kHostStream));
  }
  // 3. The senders' arena is free again once every receiver acknowledged.
  for (const Op& op : ops) {
    if (op.kind != Op::Kind::kSend) continue;
    uint32_t got = 0;
    MUONPS_RETURN_IF_ERROR(
        control_->Recv(&got, 1, DType::kFloat32, op.peer, kHostStream));
  }
  // 4. The root's sums, in the caller's order.
  for (const PendingSum& sum : sums) {
    const size_t bytes = sum.count * sizeof(float);
    if (bytes == 0) continue;
    cudaStream_t s = AsCuda(sum.stream);
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(sum.total, sum.parts[0], bytes,
                                   cudaMemcpyDeviceToDevice, s),
                   "ReduceSum"));
    for (size_t i = 1; i < sum.parts.size(); ++i) {
      MUONPS_RETURN_IF_ERROR(CudaStatus(
          LaunchAddInto(sum.total, sum.parts[i], sum.count, s), "ReduceSum"));
    }
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(sum.out, sum.total, bytes, cudaMemcpyDeviceToDevice, s),
        "ReduceSum"));
    MUONPS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "ReduceSum"));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcTransport::AwaitFrom(int peer, size_t /*count*/,
                                         DType /*dtype*/,
                                         absl::Duration timeout) {
  if (!broken_.ok()) return broken_;
  // As on the other transports: inside a group the sends this rank queued
  // have not gone out, and the peer may be waiting on them.
  if (group_.grouped()) {
    return absl::FailedPreconditionError("AwaitFrom inside a group");
  }
  // Every transfer starts with a control message: a Descriptor.
  return control_->AwaitFrom(peer, kDescriptorFloats, DType::kFloat32, timeout);
}

absl::Status CudaIpcTransport::Synchronize(Stream stream,
                                           absl::Duration timeout) {
  if (!broken_.ok()) return broken_;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const cudaError_t e = cudaStreamQuery(AsCuda(stream));
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return Fail(CudaStatus(e, "Synchronize"));
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "stream not done after ", absl::FormatDuration(timeout))));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

}  // namespace transport
}  // namespace muonps
