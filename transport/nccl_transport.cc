#include "transport/nccl_transport.h"

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
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace transport {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(std::is_same<Stream, cudaStream_t>::value,
              "muonps::Stream must be the CUDA runtime's stream type");
static_assert(std::is_same<ncclComm*, ncclComm_t>::value,
              "ncclComm_t must be a pointer to struct ncclComm");

// Polling pauses: short at first (NCCL usually finishes within a few
// hundred microseconds), then at most 1 ms so a wait costs little CPU.
constexpr absl::Duration kFirstPause = absl::Microseconds(100);
constexpr absl::Duration kLongestPause = absl::Milliseconds(1);

void Pause(absl::Duration* pause) {
  absl::SleepFor(*pause);
  *pause = std::min(*pause * 2, kLongestPause);
}

Clock::time_point DeadlineAfter(absl::Duration timeout) {
  // Clamped so that an infinite timeout cannot overflow the clock.
  const absl::Duration bounded =
      std::clamp(timeout, absl::ZeroDuration(), absl::Hours(24 * 365));
  return Clock::now() + absl::ToChronoNanoseconds(bounded);
}

bool Accepted(ncclResult_t result) {
  return result == ncclSuccess || result == ncclInProgress;
}

// System and remote errors are a lost or failing peer or network; the rest
// (CUDA errors, internal errors, misuse) are ours or the library's.
absl::StatusCode CodeFor(ncclResult_t result) {
  return result == ncclSystemError || result == ncclRemoteError
             ? absl::StatusCode::kUnavailable
             : absl::StatusCode::kInternal;
}

// NCCL's error string, with its last error message where it has one.
std::string NcclText(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&text, " (", last, ")");
  return text;
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view what,
                        ncclComm_t comm) {
  return absl::Status(CodeFor(result),
                      absl::StrCat(what, ": ", NcclText(result, comm)));
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (error == cudaErrorMemoryAllocation) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (error == cudaErrorNoDevice ||
             error == cudaErrorInsufficientDriver) {
    code = absl::StatusCode::kUnavailable;
  }
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(error),
                                         ": ", cudaGetErrorString(error)));
}

bool PartlyOverlap(const float* a, const float* b, size_t count) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  const uintptr_t bytes = count * sizeof(float);
  return x != y && x < y + bytes && y < x + bytes;
}

// Waits for a communicator outside any NcclTransport (Create, the
// destructor) to leave ncclInProgress: its final state, ncclInProgress if
// `deadline` passed first, or the error of ncclCommGetAsyncError itself.
ncclResult_t AwaitState(ncclComm_t comm, Clock::time_point deadline) {
  absl::Duration pause = kFirstPause;
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (!Accepted(result)) return result;
    if (result == ncclSuccess && state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    Pause(&pause);
  }
}

}  // namespace

absl::StatusOr<std::string> NcclTransport::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("ncclGetUniqueId: ", NcclText(result, nullptr)));
  }
  return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    int cuda_device, int rank, int size, const std::string& unique_id,
    const NcclOptions& options) {
  if (cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device ", cuda_device, ": must be >= 0"));
  }
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", size, ": must be >= 1"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": must be in [0, ", size, ") (the size)"));
  }
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unique_id: must be the ", NCCL_UNIQUE_ID_BYTES,
        " bytes of NewUniqueId(), got ", unique_id.size(), " bytes"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.timeout: must be positive");
  }
  const cudaError_t set = cudaSetDevice(cuda_device);
  if (set == cudaErrorInvalidDevice) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device ", cuda_device,
                     ": no such CUDA device (this machine has ", count, ")"));
  }
  if (set != cudaSuccess) {
    return CudaStatus(set, absl::StrCat("cudaSetDevice(", cuda_device, ")"));
  }

  const std::string who = absl::StrCat("NCCL rank ", rank, " of ", size);
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const Clock::time_point deadline = DeadlineAfter(options.timeout);
  const ncclResult_t init =
      ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (!Accepted(init)) {
    const absl::Status error =
        NcclStatus(init,
                   absl::StrCat(who, ": ncclCommInitRankConfig on CUDA device ",
                                cuda_device),
                   comm);
    if (comm != nullptr) (void)ncclCommAbort(comm);
    return error;
  }
  if (comm == nullptr) {
    return absl::InternalError(
        absl::StrCat(who, ": ncclCommInitRankConfig returned no communicator"));
  }
  // Non-blocking: the ranks meet in NCCL's own thread while this one polls.
  const ncclResult_t state = AwaitState(comm, deadline);
  if (state == ncclInProgress) {
    (void)ncclCommAbort(comm);
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": communicator not ready after ",
        absl::FormatDuration(options.timeout), " waiting for ", size,
        " ranks to join (did every rank call Create with this unique_id and "
        "size?)"));
  }
  if (state != ncclSuccess) {
    const absl::Status error = NcclStatus(
        state, absl::StrCat(who, ": joining the communicator"), comm);
    (void)ncclCommAbort(comm);
    return error;
  }
  return absl::WrapUnique(
      new NcclTransport(cuda_device, rank, size, options, comm));
}

NcclTransport::NcclTransport(int cuda_device, int rank, int size,
                             const NcclOptions& options, ncclComm* comm)
    : cuda_device_(cuda_device),
      rank_(rank),
      size_(size),
      options_(options),
      comm_(comm) {}

NcclTransport::~NcclTransport() {
  absl::MutexLock lock(&comm_mu_);
  if (comm_ == nullptr) return;
  bool healthy;
  {
    absl::MutexLock status_lock(&status_mu_);
    healthy = failure_.ok();
  }
  // A receive AwaitFrom posted and nobody sent would hold the finalize.
  if (awaited_ == Awaited::kPosted &&
      (!await_recorded_ || cudaEventQuery(await_event_) != cudaSuccess)) {
    healthy = false;
  }
  // Finalizing flushes pending work and may wait on peers: bounded by
  // options.timeout, then abort. Destroy after a finished finalize frees
  // local state only.
  if (healthy) {
    const Clock::time_point deadline = DeadlineAfter(options_.timeout);
    healthy = Accepted(ncclCommFinalize(comm_)) &&
              AwaitState(comm_, deadline) == ncclSuccess;
  }
  if (healthy) {
    (void)ncclCommDestroy(comm_);
  } else {
    spdlog::warn(
        "{} on cuda:{}: finalizing the communicator failed or took over {}; "
        "aborting it (ncclCommAbort)",
        Who(), cuda_device_, absl::FormatDuration(options_.timeout));
    (void)ncclCommAbort(comm_);
  }
  comm_ = nullptr;
  ReleaseAwait();
}

void NcclTransport::ReleaseAwait() {
  if (await_stream_ != nullptr) {
    (void)cudaStreamSynchronize(await_stream_);  // NCCL's kernels have ended
    (void)cudaStreamDestroy(await_stream_);
    await_stream_ = nullptr;
  }
  if (await_event_ != nullptr) (void)cudaEventDestroy(await_event_);
  if (await_buffer_ != nullptr) (void)cudaFree(await_buffer_);
  await_event_ = nullptr;
  await_buffer_ = nullptr;
  await_capacity_ = 0;
}

std::string NcclTransport::Who() const {
  return absl::StrCat("NCCL rank ", rank_, " of ", size_);
}

absl::Status NcclTransport::Usable() const {
  absl::MutexLock lock(&status_mu_);
  if (failure_.ok()) return absl::OkStatus();
  if (aborted_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transport was aborted and must be rebuilt: ", failure_.ToString()));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("transport is broken by an earlier error and must be "
                   "rebuilt; the error was: ",
                   failure_.ToString()));
}

absl::Status NcclTransport::Gone() const {
  const absl::Status usable = Usable();
  if (!usable.ok()) return usable;
  return absl::InternalError(
      absl::StrCat(Who(), ": the communicator is gone but no error was kept"));
}

void NcclTransport::AbortCommunicator() {
  std::string reason;
  {
    absl::MutexLock lock(&status_mu_);
    reason = failure_.ToString();
  }
  absl::MutexLock lock(&comm_mu_);
  if (comm_ == nullptr) return;
  // An abort is what frees a rank whose peer died mid-step (its kernels
  // wait on that peer until then): logged before and after, so that a
  // run that hangs in ncclCommAbort itself shows where.
  spdlog::warn("{} on cuda:{}: aborting the communicator (ncclCommAbort): {}",
               Who(), cuda_device_, reason);
  const absl::Time start = absl::Now();
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  spdlog::info("{} on cuda:{}: communicator aborted in {}", Who(), cuda_device_,
               absl::FormatDuration(absl::Now() - start));
}

absl::Status NcclTransport::Fail(const absl::Status& status) {
  const absl::Status annotated = Annotate(status, Who());
  {
    absl::MutexLock lock(&status_mu_);
    if (failure_.ok()) failure_ = annotated;
  }
  AbortCommunicator();
  queue_.clear();
  group_depth_ = 0;
  return annotated;
}

void NcclTransport::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&status_mu_);
    if (failure_.ok()) {
      failure_ = reason.ok() ? absl::AbortedError("aborted") : reason;
      aborted_ = true;
    }
  }
  AbortCommunicator();
}

absl::Status NcclTransport::CheckPeer(int peer, const char* field,
                                      bool allow_self) const {
  if (peer >= 0 && peer < size_ && (allow_self || peer != rank_)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " ", peer, ": must be a rank in [0, ", size_, ")",
      allow_self ? "" : absl::StrCat(" other than this rank (", rank_, ")")));
}

absl::Status NcclTransport::CheckStream(Stream stream, const char* call) const {
  if (stream != kHostStream) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": stream must be a CUDA stream of device ",
                   cuda_device_, ", not kHostStream"));
}

absl::Status NcclTransport::ReadState(int* state, std::string* text) {
  MUONPS_RETURN_IF_ERROR(Usable());
  *state = ncclInProgress;
  // While the owner polls, only Abort() from another thread can hold the
  // lock, and it has recorded its reason first: report that at once rather
  // than wait for ncclCommAbort to return.
  if (!comm_mu_.TryLock()) return Usable();
  const bool gone = comm_ == nullptr;
  ncclResult_t async = ncclInProgress;
  ncclResult_t result = ncclSuccess;
  if (!gone) {
    result = ncclCommGetAsyncError(comm_, &async);
    const ncclResult_t read = result == ncclSuccess ? async : result;
    *state = read;
    if (!Accepted(read)) {
      *text = NcclText(read, comm_);
      if (result != ncclSuccess) {
        absl::StrAppend(text, " (from ncclCommGetAsyncError itself)");
      }
    }
  }
  comm_mu_.Unlock();
  if (gone) return Gone();
  return absl::OkStatus();
}

absl::Status NcclTransport::WaitUntilReady(const char* what,
                                           Clock::time_point deadline) {
  absl::Duration pause = kFirstPause;
  while (true) {
    int state = ncclInProgress;
    std::string text;
    MUONPS_RETURN_IF_ERROR(ReadState(&state, &text));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return Fail(absl::Status(CodeFor(static_cast<ncclResult_t>(state)),
                               absl::StrCat(what, ": ", text)));
    }
    if (Clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          what, ": NCCL still in progress after ",
          absl::FormatDuration(options_.timeout),
          " (options.timeout; a peer rank may be missing or stalled)")));
    }
    Pause(&pause);
  }
}

std::string NcclTransport::Describe(const Call& call) {
  switch (call.kind) {
    case Call::Kind::kSend:
      return absl::StrCat("ncclSend of ", call.count, " bytes to rank ",
                          call.peer);
    case Call::Kind::kRecv:
      return absl::StrCat("ncclRecv of ", call.count, " bytes from rank ",
                          call.peer);
    case Call::Kind::kReduce:
      return absl::StrCat("ncclReduce (sum) of ", call.count,
                          " floats to root ", call.peer);
    case Call::Kind::kBroadcast:
      return absl::StrCat("ncclBroadcast of ", call.count, " bytes from root ",
                          call.peer);
  }
  return "unknown call";
}

absl::Status NcclTransport::Queue(const Call& call) {
  if (call.count > 0) queue_.push_back(call);
  if (group_depth_ > 0) return absl::OkStatus();
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
        switch (call.kind) {
          case Call::Kind::kSend:
            result = ncclSend(call.send, call.count, ncclUint8, call.peer,
                              comm_, call.stream);
            break;
          case Call::Kind::kRecv:
            result = ncclRecv(call.recv, call.count, ncclUint8, call.peer,
                              comm_, call.stream);
            break;
          case Call::Kind::kReduce:
            result = ncclReduce(call.send, call.recv, call.count, ncclFloat,
                                ncclSum, call.peer, comm_, call.stream);
            break;
          case Call::Kind::kBroadcast:
            result = ncclBroadcast(call.send, call.recv, call.count, ncclUint8,
                                   call.peer, comm_, call.stream);
            break;
        }
        if (!Accepted(result) && issued.ok()) {
          issued = NcclStatus(result, Describe(call), comm_);
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
  ++group_depth_;
  return absl::OkStatus();
}

absl::Status NcclTransport::GroupEnd() {
  MUONPS_RETURN_IF_ERROR(Usable());
  if (group_depth_ == 0) {
    return Fail(absl::FailedPreconditionError(
        "GroupEnd without a matching GroupStart"));
  }
  --group_depth_;
  if (group_depth_ > 0) return absl::OkStatus();
  return IssueQueue();
}

absl::Status NcclTransport::Send(const void* data, size_t bytes, int peer,
                                 Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Send");
  if (valid.ok()) valid = CheckPeer(peer, "Send: peer", /*allow_self=*/false);
  if (valid.ok() && data == nullptr && bytes > 0) {
    valid = absl::InvalidArgumentError("Send: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  return Queue({Call::Kind::kSend, data, nullptr, bytes, peer, stream});
}

absl::Status NcclTransport::Recv(void* data, size_t bytes, int peer,
                                 Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Recv");
  if (valid.ok()) valid = CheckPeer(peer, "Recv: peer", /*allow_self=*/false);
  if (valid.ok() && data == nullptr && bytes > 0) {
    valid = absl::InvalidArgumentError("Recv: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  if (awaited_ != Awaited::kNone && peer == awaited_peer_) {
    return TakeAwaited(data, bytes, stream);
  }
  return Queue({Call::Kind::kRecv, nullptr, data, bytes, peer, stream});
}

absl::Status NcclTransport::TakeAwaited(void* data, size_t bytes,
                                        Stream stream) {
  if (bytes != awaited_bytes_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "Recv: ", bytes, " bytes from rank ", awaited_peer_,
        ", whose next message (awaited by AwaitFrom) has ", awaited_bytes_)));
  }
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
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "ReduceSum");
  if (valid.ok()) {
    valid = CheckPeer(root, "ReduceSum: root", /*allow_self=*/true);
  }
  const bool on_root = root == rank_;
  if (valid.ok() &&
      count > std::numeric_limits<size_t>::max() / sizeof(float)) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("ReduceSum: count ", count, " is too large"));
  } else if (valid.ok() && count > 0 && send == nullptr) {
    valid = absl::InvalidArgumentError("ReduceSum: send is null");
  } else if (valid.ok() && on_root && count > 0 && recv == nullptr) {
    valid = absl::InvalidArgumentError("ReduceSum: recv is null on the root");
  } else if (valid.ok() && on_root && PartlyOverlap(send, recv, count)) {
    valid = absl::InvalidArgumentError(
        "ReduceSum: recv partly overlaps send (it may only be send itself)");
  }
  if (valid.ok() && !order.empty()) {
    std::vector<bool> seen(size_, false);
    bool permutation = static_cast<int>(order.size()) == size_;
    for (int r : order) {
      permutation = permutation && r >= 0 && r < size_ && !seen[r];
      if (permutation) seen[r] = true;
    }
    if (!permutation) {
      valid = absl::InvalidArgumentError(absl::StrCat(
          "ReduceSum: order is not a permutation of the ", size_, " ranks"));
    }
  }
  if (!valid.ok()) return Fail(valid);
  // `order` is not passed on: NCCL sums in its own order.
  return Queue({Call::Kind::kReduce, send, on_root ? recv : nullptr, count,
                root, stream});
}

absl::Status NcclTransport::Broadcast(void* data, size_t bytes, int root,
                                      Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Broadcast");
  if (valid.ok()) {
    valid = CheckPeer(root, "Broadcast: root", /*allow_self=*/true);
  }
  if (valid.ok() && data == nullptr && bytes > 0) {
    valid = absl::InvalidArgumentError("Broadcast: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  return Queue({Call::Kind::kBroadcast, data, data, bytes, root, stream});
}

absl::Status NcclTransport::AwaitFrom(int peer, size_t bytes,
                                      absl::Duration timeout) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckPeer(peer, "AwaitFrom: peer", /*allow_self=*/false);
  if (valid.ok() && group_depth_ > 0) {
    valid = absl::FailedPreconditionError("AwaitFrom inside a group");
  }
  if (valid.ok() && awaited_ != Awaited::kNone &&
      (peer != awaited_peer_ || bytes != awaited_bytes_)) {
    valid = absl::FailedPreconditionError(absl::StrCat(
        "AwaitFrom(rank ", peer, ", ", bytes, " bytes) while a message of ",
        awaited_bytes_, " bytes from rank ", awaited_peer_,
        " is awaited and not yet received"));
  }
  if (!valid.ok()) return Fail(valid);
  if (awaited_ == Awaited::kArrived) return absl::OkStatus();
  if (awaited_ == Awaited::kNone) {
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
    queue_.push_back({Call::Kind::kRecv, nullptr, await_buffer_, bytes, peer,
                      await_stream_});
    MUONPS_RETURN_IF_ERROR(EnqueueQueue());
    awaited_ = Awaited::kPosted;
    awaited_peer_ = peer;
    awaited_bytes_ = bytes;
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
  absl::Duration pause = kFirstPause;
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
    Pause(&pause);
  }
}

absl::Status NcclTransport::Synchronize(Stream stream, absl::Duration timeout) {
  MUONPS_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckStream(stream, "Synchronize");
  if (valid.ok() && group_depth_ > 0) {
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
