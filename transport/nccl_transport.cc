// NcclTransport's set-up, state and abort (the queued calls and waits are
// in nccl_transport_calls.cc).
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
#include "common/cuda_status.h"
#include "common/poll_backoff.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "transport/nccl_status.h"

namespace muonps {
namespace transport {
namespace {

using nccl::Accepted;
using nccl::Clock;
using nccl::CodeFor;
using nccl::DeadlineAfter;
using nccl::NcclStatus;
using nccl::NcclText;

static_assert(std::is_same<Stream, cudaStream_t>::value,
              "muonps::Stream must be the CUDA runtime's stream type");
static_assert(std::is_same<ncclComm*, ncclComm_t>::value,
              "ncclComm_t must be a pointer to struct ncclComm");

// Waits for a communicator outside any NcclTransport (Create, the
// destructor) to leave ncclInProgress: its final state, ncclInProgress if
// `deadline` passed first, or the error of ncclCommGetAsyncError itself.
ncclResult_t AwaitState(ncclComm_t comm, Clock::time_point deadline) {
  PollBackoff backoff;
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (!Accepted(result)) return result;
    if (result == ncclSuccess && state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    backoff.Pause();
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
    for (ncclComm_t split : split_comms_) {
      if (split == nullptr) continue;
      healthy = healthy && Accepted(ncclCommFinalize(split)) &&
                AwaitState(split, deadline) == ncclSuccess;
    }
    healthy = healthy && Accepted(ncclCommFinalize(comm_)) &&
              AwaitState(comm_, deadline) == ncclSuccess;
  }
  if (healthy) {
    for (ncclComm_t split : split_comms_) {
      if (split != nullptr) (void)ncclCommDestroy(split);
    }
    (void)ncclCommDestroy(comm_);
  } else {
    spdlog::warn(
        "{} on cuda:{}: finalizing the communicator failed or took over {}; "
        "aborting it (ncclCommAbort)",
        Who(), cuda_device_, absl::FormatDuration(options_.timeout));
    for (ncclComm_t split : split_comms_) {
      if (split != nullptr) (void)ncclCommAbort(split);
    }
    (void)ncclCommAbort(comm_);
  }
  comm_ = nullptr;
  for (ncclComm_t& split : split_comms_) split = nullptr;
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
  for (ncclComm_t& split : split_comms_) {
    if (split != nullptr) (void)ncclCommAbort(split);
    split = nullptr;
  }
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
  group_.Reset();
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

absl::Status NcclTransport::CheckStream(Stream stream,
                                        absl::string_view call) const {
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
  // This communicator, then the splits': the first error, else in
  // progress where any is.
  for (int split = -1; split < kSplits && !gone; ++split) {
    ncclComm_t comm = CommOf(split);
    if (comm == nullptr) continue;
    result = ncclCommGetAsyncError(comm, &async);
    const ncclResult_t read = result == ncclSuccess ? async : result;
    if (!Accepted(read)) {
      *state = read;
      *text = NcclText(read, comm);
      if (result != ncclSuccess) {
        absl::StrAppend(text, " (from ncclCommGetAsyncError itself)");
      }
      if (split >= 0) {
        absl::StrAppend(text, " (", SplitName(static_cast<Split>(split)), ")");
      }
      break;
    }
    if (split < 0 || read == ncclInProgress) *state = read;
  }
  comm_mu_.Unlock();
  if (gone) return Gone();
  return absl::OkStatus();
}

absl::Status NcclTransport::WaitUntilReady(const char* what,
                                           Clock::time_point deadline) {
  PollBackoff backoff;
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
    backoff.Pause();
  }
}

ncclComm* NcclTransport::CommOf(int split) {
  return split < 0 ? comm_ : split_comms_[split];
}

absl::Status NcclTransport::OnSplit(Split split,
                                    const std::vector<std::vector<int>>& groups,
                                    int mine) {
  MUONPS_RETURN_IF_ERROR(Usable());
  if (group_.grouped()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat(CallIn("FormSplit", split), " inside a group")));
  }
  // No NCCL call may start while AwaitFrom's receive is being enqueued.
  MUONPS_RETURN_IF_ERROR(FinishAwaitEnqueue());
  const Clock::time_point deadline = DeadlineAfter(options_.timeout);
  const std::string what = absl::StrCat(
      "ncclCommSplit into group ", mine, " of ", groups.size(), " of ",
      SplitName(split), " (", groups[mine].size(), " ranks)");
  absl::Status made_split;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return Gone();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // The colour is the group's index, the key this rank: the group's
    // ranks are its members in ascending order. Non-blocking, NCCL makes
    // the communicator on a thread of its own and writes its handle into
    // splitting_ by the time this one leaves ncclInProgress.
    const ncclResult_t result =
        ncclCommSplit(comm_, mine, rank_, &splitting_, &config);
    if (!Accepted(result)) made_split = NcclStatus(result, what, comm_);
  }
  if (!made_split.ok()) return Fail(made_split);
  MUONPS_RETURN_IF_ERROR(WaitUntilReady(what.c_str(), deadline));
  {
    // NCCL is done writing splitting_: only this thread reads it.
    absl::MutexLock lock(&comm_mu_);
    ncclComm_t made = splitting_;
    splitting_ = nullptr;
    if (made == nullptr) {
      made_split = absl::InternalError(
          absl::StrCat(what, ": NCCL made no communicator"));
    } else if (comm_ == nullptr) {
      (void)ncclCommAbort(made);  // aborted meanwhile: so is this one
      made_split = Gone();
    } else {
      split_comms_[static_cast<int>(split)] = made;
    }
  }
  if (!made_split.ok()) return Fail(made_split);
  // The split's communicator ready too (all polled).
  MUONPS_RETURN_IF_ERROR(WaitUntilReady(what.c_str(), deadline));
  spdlog::info("{} on cuda:{}: {} formed", Who(), cuda_device_, what);
  return absl::OkStatus();
}

}  // namespace transport
}  // namespace muonps
