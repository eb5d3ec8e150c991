// NcclTransport's queued calls (grouped sends, receives, reductions and
// broadcasts), the posted receive of AwaitFrom, and the polling waits
// (set-up, state and abort are in nccl_transport.cc).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
#include "common/poll_backoff.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "transport/nccl_status.h"
#include "transport/nccl_transport.h"

namespace muonps {
namespace transport {
namespace {

using nccl::Accepted;
using nccl::Clock;
using nccl::DeadlineAfter;
using nccl::NcclStatus;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

}  // namespace

std::string NcclTransport::Describe(const Call& call) {
  // A split's root is a position in this rank's group of it.
  const std::string root =
      call.split < 0
          ? absl::StrCat("root ", call.peer)
          : absl::StrCat("position ", call.peer, " of this rank's group of ",
                         SplitName(static_cast<Split>(call.split)));
  switch (call.kind) {
    case Call::Kind::kSend:
      return absl::StrCat("ncclSend of ", call.count, " ",
                          DTypeName(call.dtype), " to rank ", call.peer);
    case Call::Kind::kRecv:
      return absl::StrCat("ncclRecv of ", call.count, " ",
                          DTypeName(call.dtype), " from rank ", call.peer);
    case Call::Kind::kReduce:
      return absl::StrCat("ncclReduce (sum) of ", call.count, " floats to ",
                          root);
    case Call::Kind::kBroadcast:
      return absl::StrCat("ncclBroadcast of ", call.count, " ",
                          DTypeName(call.dtype), " from ", root);
  }
  return "unknown call";
}

absl::Status NcclTransport::Queue(const Call& call) {
  if (call.count > 0) queue_.push_back(call);
  if (group_.grouped()) return absl::OkStatus();
  return IssueQueue();
}

absl::Status NcclTransport::IssueQueue() {
  if (queue_.empty()) return absl::OkStatus();
  // Nothing may be issued while AwaitFrom's receive is still being enqueued.
  MUONPS_RETURN_IF_ERROR(FinishAwaitEnqueue());
  const Clock::time_point deadline = DeadlineAfter(options_.timeout);
  MUONPS_RETURN_IF_ERROR(EnqueueQueue());
  // Until the state leaves ncclInProgress NCCL may not have put the
  // transfers on their streams yet (the first transfer to a peer connects to
  // it here), and nothing else may be enqueued on those streams.
  return WaitUntilReady("ncclGroupEnd", deadline);
}

absl::Status NcclTransport::EnqueueQueue() {
  std::vector<Call> calls;
  calls.swap(queue_);
  if (calls.empty()) return absl::OkStatus();
  absl::Status issued;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return Gone();
    // One NCCL group per batch, opened and closed under the lock: Abort()
    // from another thread never finds this thread inside an NCCL group.
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) {
      issued = NcclStatus(result, "ncclGroupStart", comm_);
    } else {
      for (const Call& call : calls) {
        // A split's calls go to its communicator, in the same NCCL group
        // (all are non-blocking).
        ncclComm_t comm = CommOf(call.split);
        if (comm == nullptr) {
          if (issued.ok()) issued = Gone();
          continue;
        }
        switch (call.kind) {
          case Call::Kind::kSend:
            result = ncclSend(call.send, call.count, NcclType(call.dtype),
                              call.peer, comm, call.stream);
            break;
          case Call::Kind::kRecv:
            result = ncclRecv(call.recv, call.count, NcclType(call.dtype),
                              call.peer, comm, call.stream);
            break;
          case Call::Kind::kReduce:
            result = ncclReduce(call.send, call.recv, call.count, ncclFloat32,
                                ncclSum, call.peer, comm, call.stream);
            break;
          case Call::Kind::kBroadcast:
            result = ncclBroadcast(call.send, call.recv, call.count,
                                   NcclType(call.dtype), call.peer, comm,
                                   call.stream);
            break;
        }
        if (!Accepted(result) && issued.ok()) {
          issued = NcclStatus(result, Describe(call), comm);
        }
      }
      // Always closed, also after an error: NCCL's group state is per
      // thread and would otherwise swallow this thread's later NCCL calls.
      result = ncclGroupEnd();
      if (!Accepted(result) && issued.ok()) {
        issued = NcclStatus(result, "ncclGroupEnd", comm_);
      }
    }
  }
  if (!issued.ok()) return Fail(issued);
  return absl::OkStatus();
}

absl::Status NcclTransport::FinishAwaitEnqueue() {
  if (awaited_ != Awaited::kPosted || await_recorded_) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(
      WaitUntilReady("AwaitFrom's ncclRecv", DeadlineAfter(options_.timeout)));
  return RecordAwaitEvent();
}

absl::Status NcclTransport::RecordAwaitEvent() {
  const cudaError_t error = cudaEventRecord(await_event_, await_stream_);
  if (error != cudaSuccess) {
    return Fail(CudaStatus(error, "AwaitFrom: recording its event"));
  }
  await_recorded_ = true;
  return absl::OkStatus();
}

absl::Status NcclTransport::GroupStart() {
  MUONPS_RETURN_IF_ERROR(Usable());
  group_.Start();
  return absl::OkStatus();
}

absl::Status NcclTransport::GroupEnd() {
  MUONPS_RETURN_IF_ERROR(Usable());
  const absl::StatusOr<bool> outermost = group_.End();
  if (!outermost.ok()) return Fail(outermost.status());
  if (!*outermost) return absl::OkStatus();
  return IssueQueue();
}

absl::Status NcclTransport::Send(const void* data, size_t count, DType dtype,
                                 int peer, Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Send");
  if (valid.ok()) valid = CheckPeer(peer, "Send: peer", /*allow_self=*/false);
  if (valid.ok() && data == nullptr && count > 0) {
    valid = absl::InvalidArgumentError("Send: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  return Queue({Call::Kind::kSend, data, nullptr, count, dtype, peer, stream});
}

absl::Status NcclTransport::Recv(void* data, size_t count, DType dtype,
                                 int peer, Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Recv");
  if (valid.ok()) valid = CheckPeer(peer, "Recv: peer", /*allow_self=*/false);
  if (valid.ok() && data == nullptr && count > 0) {
    valid = absl::InvalidArgumentError("Recv: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  if (awaited_ != Awaited::kNone && peer == awaited_peer_) {
    return TakeAwaited(data, count, dtype, stream);
  }
  return Queue({Call::Kind::kRecv, nullptr, data, count, dtype, peer, stream});
}

absl::Status NcclTransport::TakeAwaited(void* data, size_t count, DType dtype,
                                        Stream stream) {
  if (count != awaited_count_ || dtype != awaited_dtype_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "Recv: ", count, " ", DTypeName(dtype), " from rank ", awaited_peer_,
        ", whose next message (awaited by AwaitFrom) has ", awaited_count_, " ",
        DTypeName(awaited_dtype_))));
  }
  // AwaitFrom checked that this does not overflow.
  const size_t bytes = count * DTypeSize(dtype);
  MUONPS_RETURN_IF_ERROR(FinishAwaitEnqueue());
  const cudaStream_t s = stream;
  cudaError_t error = cudaStreamWaitEvent(s, await_event_, 0);
  if (error == cudaSuccess && bytes > 0) {
    error = cudaMemcpyAsync(data, await_buffer_, bytes,
                            cudaMemcpyDeviceToDevice, s);
  }
  if (error != cudaSuccess) {
    return Fail(CudaStatus(error, "Recv: copying the awaited message"));
  }
  awaited_ = Awaited::kNone;
  return absl::OkStatus();
}

absl::Status NcclTransport::ReduceSum(const float* send, float* recv,
                                      size_t count, int root,
                                      absl::Span<const int> order,
                                      Stream stream) {
  return Reduce("ReduceSum", /*split=*/-1, EveryRank(), send, recv, count, root,
                order, stream);
}

absl::Status NcclTransport::ReduceSumIn(Split split, const float* send,
                                        float* recv, size_t count, int root,
                                        absl::Span<const int> order,
                                        Stream stream) {
  // Formed: the split succeeded (FormSplit records it after).
  const bool formed = !group(split).empty();
  return Reduce(CallIn("ReduceSumIn", split),
                formed ? static_cast<int>(split) : -1, MembersOf(split), send,
                recv, count, root, order, stream);
}

absl::Status NcclTransport::Reduce(absl::string_view call, int split,
                                   const std::vector<int>& members,
                                   const float* send, float* recv, size_t count,
                                   int root, absl::Span<const int> order,
                                   Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, call);
  if (valid.ok()) {
    valid = CheckSum(call, members, send, recv, count, root, order).status();
  }
  if (!valid.ok()) return Fail(valid);
  const bool on_root = root == rank_;
  const int position = static_cast<int>(
      std::lower_bound(members.begin(), members.end(), root) - members.begin());
  // `order` is not passed on: NCCL sums in its own order.
  return Queue({Call::Kind::kReduce, send, on_root ? recv : nullptr, count,
                DType::kFloat32, position, stream, split});
}

absl::Status NcclTransport::Broadcast(void* data, size_t count, DType dtype,
                                      int root, Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Broadcast");
  if (valid.ok()) {
    valid = CheckPeer(root, "Broadcast: root", /*allow_self=*/true);
  }
  if (valid.ok() && data == nullptr && count > 0) {
    valid = absl::InvalidArgumentError("Broadcast: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  return Queue(
      {Call::Kind::kBroadcast, data, data, count, dtype, root, stream});
}

absl::Status NcclTransport::BroadcastIn(Split split, void* data, size_t count,
                                        DType dtype, int root, Stream stream) {
  // Formed: the split succeeded (FormSplit records it after).
  if (group(split).empty()) return Broadcast(data, count, dtype, root, stream);
  MUONPS_RETURN_IF_ERROR(Usable());
  const std::string call = CallIn("BroadcastIn", split);
  absl::Status valid = CheckStream(stream, call);
  if (valid.ok()) valid = CheckRoot(call, group(split), root);
  if (valid.ok() && data == nullptr && count > 0) {
    valid = absl::InvalidArgumentError(absl::StrCat(call, ": data is null"));
  }
  if (!valid.ok()) return Fail(valid);
  return Queue({Call::Kind::kBroadcast, data, data, count, dtype,
                PositionIn(split, root), stream, static_cast<int>(split)});
}

absl::Status NcclTransport::AwaitFrom(int peer, size_t count, DType dtype,
                                      absl::Duration timeout) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckPeer(peer, "AwaitFrom: peer", /*allow_self=*/false);
  if (valid.ok() && group_.grouped()) {
    valid = absl::FailedPreconditionError("AwaitFrom inside a group");
  }
  if (valid.ok() &&
      count > std::numeric_limits<size_t>::max() / DTypeSize(dtype)) {
    valid = absl::InvalidArgumentError(absl::StrCat(
        "AwaitFrom: count ", count, " of ", DTypeName(dtype), " is too large"));
  }
  if (valid.ok() && awaited_ != Awaited::kNone &&
      (peer != awaited_peer_ || count != awaited_count_ ||
       dtype != awaited_dtype_)) {
    valid = absl::FailedPreconditionError(absl::StrCat(
        "AwaitFrom(rank ", peer, ", ", count, " ", DTypeName(dtype),
        ") while a message of ", awaited_count_, " ", DTypeName(awaited_dtype_),
        " from rank ", awaited_peer_, " is awaited and not yet received"));
  }
  if (!valid.ok()) return Fail(valid);
  if (awaited_ == Awaited::kArrived) return absl::OkStatus();
  if (awaited_ == Awaited::kNone) {
    const size_t bytes = count * DTypeSize(dtype);
    cudaError_t error = cudaSuccess;
    if (await_stream_ == nullptr) {
      error = cudaStreamCreateWithFlags(&await_stream_, cudaStreamNonBlocking);
    }
    if (error == cudaSuccess && await_event_ == nullptr) {
      error = cudaEventCreateWithFlags(&await_event_, cudaEventDisableTiming);
    }
    if (error == cudaSuccess && await_capacity_ < bytes) {
      if (await_buffer_ != nullptr) (void)cudaFree(await_buffer_);
      await_buffer_ = nullptr;
      await_capacity_ = 0;
      error = cudaMalloc(&await_buffer_, bytes);
      if (error == cudaSuccess) await_capacity_ = bytes;
    }
    if (error != cudaSuccess) {
      return Fail(CudaStatus(error, "AwaitFrom: its stream and buffer"));
    }
    // Enqueued without waiting: the first receive from a peer also connects
    // to it, which completes only once that peer sends (below, polled).
    queue_.push_back({Call::Kind::kRecv, nullptr, await_buffer_, count, dtype,
                      peer, await_stream_});
    MUONPS_RETURN_IF_ERROR(EnqueueQueue());
    awaited_ = Awaited::kPosted;
    awaited_peer_ = peer;
    awaited_count_ = count;
    awaited_dtype_ = dtype;
    await_recorded_ = false;
  }
  const absl::Status arrived = PollUntil(
      [&](int state) -> absl::StatusOr<bool> {
        // Once NCCL has put the receive on the stream, its event follows it.
        if (state == ncclSuccess && !await_recorded_) {
          MUONPS_RETURN_IF_ERROR(RecordAwaitEvent());
        }
        if (!await_recorded_) return false;
        const cudaError_t query = cudaEventQuery(await_event_);
        if (query == cudaSuccess) return true;
        if (query == cudaErrorNotReady) return false;
        return Fail(CudaStatus(query, "AwaitFrom: cudaEventQuery"));
      },
      DeadlineAfter(timeout), absl::StrCat("awaiting rank ", peer));
  if (absl::IsDeadlineExceeded(arrived)) {
    // The receive stays posted and the transport usable.
    return absl::DeadlineExceededError(
        absl::StrCat(Who(), ": no message from rank ", peer, " within ",
                     absl::FormatDuration(timeout)));
  }
  if (arrived.ok()) awaited_ = Awaited::kArrived;
  return arrived;
}

absl::Status NcclTransport::PollUntil(
    const std::function<absl::StatusOr<bool>(int state)>& done,
    Clock::time_point deadline, absl::string_view waiting_for) {
  PollBackoff backoff;
  while (true) {
    int state = ncclInProgress;
    std::string text;
    // FAILED_PRECONDITION as soon as another thread aborts.
    MUONPS_RETURN_IF_ERROR(ReadState(&state, &text));
    if (state != ncclSuccess && state != ncclInProgress) {
      const absl::Status error = absl::UnavailableError(absl::StrCat(
          Who(), ": asynchronous NCCL error while ", waiting_for, ": ", text));
      Abort(error);
      return error;
    }
    MUONPS_ASSIGN_OR_RETURN(const bool finished, done(state));
    if (finished) return absl::OkStatus();
    if (Clock::now() >= deadline) return absl::DeadlineExceededError("");
    backoff.Pause();
  }
}

absl::Status NcclTransport::Synchronize(Stream stream, absl::Duration timeout) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Synchronize");
  if (valid.ok() && group_.grouped()) {
    valid = absl::FailedPreconditionError(
        "Synchronize inside a group (its calls are issued at GroupEnd)");
  }
  if (!valid.ok()) return Fail(valid);
  const absl::Status done = PollUntil(
      [&](int) -> absl::StatusOr<bool> {
        const cudaError_t query = cudaStreamQuery(stream);
        if (query == cudaSuccess) return true;
        if (query == cudaErrorNotReady) return false;
        return Fail(CudaStatus(query, "cudaStreamQuery"));
      },
      DeadlineAfter(timeout), "waiting for the stream");
  if (absl::IsDeadlineExceeded(done)) {
    const absl::Status error = absl::DeadlineExceededError(absl::StrCat(
        Who(), ": stream not done after ", absl::FormatDuration(timeout),
        " (a peer rank may be missing or stalled)"));
    Abort(error);
    return error;
  }
  return done;
}

}  // namespace transport
}  // namespace muonps
