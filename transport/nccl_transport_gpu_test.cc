// GPU tests of NcclTransport: a one-rank communicator on device 0 moves
// device buffers on a stream, refuses bad arguments, ends a waiting
// Synchronize when aborted from another thread or when its timeout passes,
// can be rebuilt with a fresh unique id after an abort, and Create gives
// DEADLINE_EXCEEDED instead of hanging when a rank never joins; both splits
// (owner groups, rails) get communicators of their own; with two GPUs, two
// ranks exchange Send/Recv, ReduceSum, Broadcast and the splits' calls. Nothing
// may hang: every case that could runs under a watchdog that ends the process.
// Needs a GPU: tagged manual, run on the GPU machine by deploy/device.
#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl_transport.h"

namespace muonps {
namespace transport {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#define ASSERT_CUDA(expr)                                    \
  do {                                                       \
    const cudaError_t cuda_error_ = (expr);                  \
    ASSERT_EQ(cuda_error_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(cuda_error_); \
  } while (0)

// Runs `body` on its own thread. If it has not returned after `limit` the
// process ends with an error: a hang in NCCL must not stall the GPU suite.
void WithinOrExit(absl::Duration limit, const char* what,
                  std::function<void()> body) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread runner([done, body = std::move(body)] {
    body();
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(done->mu);
  if (!done->cv.wait_for(lock, absl::ToChronoSeconds(limit),
                         [&] { return done->done; })) {
    std::fprintf(stderr, "FATAL: %s still running after %s: exiting\n", what,
                 absl::FormatDuration(limit).c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  lock.unlock();
  runner.join();
}

// Sleeps on the GPU stream's behalf: keeps a stream busy for a while.
void CUDART_CB SleepOneAndAHalfSeconds(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
}

// Device floats, freed on destruction.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t count) : count_(count) {
    error_ = cudaMalloc(&data_, bytes());
    if (error_ != cudaSuccess) data_ = nullptr;
  }
  ~DeviceFloats() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  cudaError_t error() const { return error_; }
  float* get() const { return static_cast<float*>(data_); }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(float); }

  cudaError_t Upload(const std::vector<float>& values) {
    return cudaMemcpy(data_, values.data(), bytes(), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<float>* values) const {
    values->resize(count_);
    return cudaMemcpy(values->data(), data_, bytes(), cudaMemcpyDeviceToHost);
  }

 private:
  size_t count_;
  void* data_ = nullptr;
  cudaError_t error_;
};

// A stream of the current device; waits for it and destroys it on
// destruction.
class OwnedStream {
 public:
  OwnedStream() { error_ = cudaStreamCreate(&stream_); }
  ~OwnedStream() {
    if (error_ == cudaSuccess) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

  cudaError_t error() const { return error_; }
  Stream get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaError_t error_;
};

std::vector<float> Ramp(size_t count, float start, float step) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = start + step * (i % 4096);
  return values;
}

class NcclTransportGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // NVLink multicast stays off on the GPU machines (DEVICE.md).
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  }

  void SetUp() override {
    const cudaError_t error = cudaGetDeviceCount(&devices_);
    ASSERT_EQ(error, cudaSuccess)
        << "no usable CUDA device: " << cudaGetErrorString(error);
    ASSERT_GE(devices_, 1);
  }

  // A one-rank communicator on device 0 (which becomes current).
  static std::unique_ptr<NcclTransport> OneRank() {
    absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return nullptr;
    EXPECT_EQ(id->size(), 128u);
    absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
        NcclTransport::Create(/*cuda_device=*/0, /*rank=*/0, /*size=*/1, *id,
                              NcclOptions());
    EXPECT_TRUE(transport.ok()) << transport.status();
    return transport.ok() ? *std::move(transport) : nullptr;
  }

  int devices_ = 0;
};

// One rank: Broadcast leaves the root's bytes and a sum over one rank is
// that rank's floats, exactly; in place and out of place, in one group.
void ExpectGroupedBroadcastAndReduceSumOnOneRank(NcclTransport& transport) {
  constexpr size_t kCount = 100000;
  OwnedStream stream;
  ASSERT_CUDA(stream.error());
  DeviceFloats broadcast(kCount), in_place(kCount), send(kCount), recv(kCount);
  ASSERT_CUDA(broadcast.error());
  ASSERT_CUDA(in_place.error());
  ASSERT_CUDA(send.error());
  ASSERT_CUDA(recv.error());
  const std::vector<float> broadcast_values = Ramp(kCount, -3.0f, 0.25f);
  const std::vector<float> in_place_values = Ramp(kCount, 1.0f, 0.5f);
  const std::vector<float> send_values = Ramp(kCount, 7.0f, -0.125f);
  ASSERT_CUDA(broadcast.Upload(broadcast_values));
  ASSERT_CUDA(in_place.Upload(in_place_values));
  ASSERT_CUDA(send.Upload(send_values));
  ASSERT_CUDA(recv.Upload(std::vector<float>(kCount, 0.0f)));

  ASSERT_TRUE(transport.GroupStart().ok());
  ASSERT_TRUE(transport
                  .Broadcast(broadcast.get(), broadcast.count(),
                             DType::kFloat32, /*root=*/0, stream.get())
                  .ok());
  ASSERT_TRUE(transport
                  .ReduceSum(in_place.get(), in_place.get(), kCount,
                             /*root=*/0, /*order=*/{}, stream.get())
                  .ok());
  const int order[] = {0};
  ASSERT_TRUE(transport
                  .ReduceSum(send.get(), recv.get(), kCount, /*root=*/0, order,
                             stream.get())
                  .ok());
  const absl::Status ended = transport.GroupEnd();
  ASSERT_TRUE(ended.ok()) << ended;
  const absl::Status synced =
      transport.Synchronize(stream.get(), absl::Seconds(10));
  ASSERT_TRUE(synced.ok()) << synced;

  std::vector<float> got;
  ASSERT_CUDA(broadcast.Download(&got));
  EXPECT_EQ(got, broadcast_values);
  ASSERT_CUDA(in_place.Download(&got));
  EXPECT_EQ(got, in_place_values);
  ASSERT_CUDA(recv.Download(&got));
  EXPECT_EQ(got, send_values);
}

TEST_F(NcclTransportGpuTest,
       OneRankGroupedBroadcastAndReduceSumGiveExactValuesAfterSynchronize) {
  std::unique_ptr<NcclTransport> transport = OneRank();
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(transport->rank(), 0);
  EXPECT_EQ(transport->size(), 1);
  EXPECT_EQ(transport->cuda_device(), 0);
  EXPECT_EQ(transport->memory(), MemoryKind::kCuda);
  ExpectGroupedBroadcastAndReduceSumOnOneRank(*transport);
  // Still healthy: a second round works too.
  ExpectGroupedBroadcastAndReduceSumOnOneRank(*transport);
}

TEST_F(NcclTransportGpuTest, CreateRefusesBadArgumentsNamingTheField) {
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const NcclOptions options;
  struct Case {
    int device, rank, size;
    std::string id;
    const char* names;
  };
  const std::vector<Case> cases = {
      {-1, 0, 1, *id, "cuda_device -1"},
      {devices_ + 100, 0, 1, *id, "no such CUDA device"},
      {0, 2, 2, *id, "rank 2"},
      {0, -1, 2, *id, "rank -1"},
      {0, 0, 0, *id, "size 0"},
      {0, 0, 1, "short", "unique_id"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
        NcclTransport::Create(c.device, c.rank, c.size, c.id, options);
    EXPECT_EQ(transport.status().code(), absl::StatusCode::kInvalidArgument)
        << transport.status();
    EXPECT_THAT(transport.status().message(), HasSubstr(c.names));
  }
  NcclOptions no_time;
  no_time.timeout = absl::ZeroDuration();
  EXPECT_THAT(NcclTransport::Create(0, 0, 1, *id, no_time).status().message(),
              HasSubstr("options.timeout"));
}

TEST_F(NcclTransportGpuTest, ReduceSumRefusesAnOrderThatIsNotAPermutation) {
  std::unique_ptr<NcclTransport> transport = OneRank();
  ASSERT_NE(transport, nullptr);
  OwnedStream stream;
  ASSERT_CUDA(stream.error());
  DeviceFloats data(16);
  ASSERT_CUDA(data.error());
  const int order[] = {1};
  const absl::Status status = transport->ReduceSum(
      data.get(), data.get(), data.count(), 0, order, stream.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("order is not a permutation"),
                                      HasSubstr("NCCL rank 0 of 1")));
  // The peers expected that call: the transport is broken.
  const absl::Status after = transport->Broadcast(
      data.get(), data.count(), DType::kFloat32, 0, stream.get());
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_THAT(after.message(), HasSubstr("order is not a permutation"));
}

TEST_F(NcclTransportGpuTest, SendOrRecvWithItselfIsInvalidArgument) {
  DeviceFloats data(16);
  ASSERT_CUDA(data.error());
  OwnedStream stream;
  ASSERT_CUDA(stream.error());
  {
    std::unique_ptr<NcclTransport> transport = OneRank();
    ASSERT_NE(transport, nullptr);
    const absl::Status status = transport->Send(
        data.get(), data.count(), DType::kFloat32, /*peer=*/0, stream.get());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("Send: peer 0"),
                                        HasSubstr("other than this rank")));
  }
  {
    std::unique_ptr<NcclTransport> transport = OneRank();
    ASSERT_NE(transport, nullptr);
    const absl::Status status = transport->Recv(
        data.get(), data.count(), DType::kFloat32, /*peer=*/0, stream.get());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("Recv: peer 0"));
  }
}

TEST_F(NcclTransportGpuTest, DataCallsRefuseTheHostStream) {
  std::unique_ptr<NcclTransport> transport = OneRank();
  ASSERT_NE(transport, nullptr);
  DeviceFloats data(16);
  ASSERT_CUDA(data.error());
  const absl::Status status = transport->Broadcast(
      data.get(), data.count(), DType::kFloat32, 0, kHostStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("kHostStream"));
}

TEST_F(NcclTransportGpuTest, GroupEndWithoutGroupStartBreaksTheTransport) {
  std::unique_ptr<NcclTransport> transport = OneRank();
  ASSERT_NE(transport, nullptr);
  const absl::Status status = transport->GroupEnd();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("without a matching GroupStart"));
  EXPECT_THAT(transport->GroupStart().message(),
              HasSubstr("broken by an earlier error"));
}

TEST_F(NcclTransportGpuTest,
       AbortFromAnotherThreadEndsSynchronizeAndLaterCallsQuoteTheReason) {
  WithinOrExit(absl::Seconds(60), "abort from another thread", [] {
    std::unique_ptr<NcclTransport> transport = OneRank();
    ASSERT_NE(transport, nullptr);
    OwnedStream stream;
    ASSERT_CUDA(stream.error());
    DeviceFloats data(1024);
    ASSERT_CUDA(data.error());
    ASSERT_TRUE(transport
                    ->Broadcast(data.get(), data.count(), DType::kFloat32, 0,
                                stream.get())
                    .ok());
    // Keeps the stream busy for 1.5 s after the broadcast.
    ASSERT_CUDA(
        cudaLaunchHostFunc(stream.get(), SleepOneAndAHalfSeconds, nullptr));
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      transport->Abort(absl::CancelledError("plan version 7 was replaced"));
    });
    const Clock::time_point start = Clock::now();
    const absl::Status status =
        transport->Synchronize(stream.get(), absl::Seconds(30));
    const double seconds = SecondsSince(start);
    aborter.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("transport was aborted and must be rebuilt"),
                      HasSubstr("plan version 7 was replaced")));
    EXPECT_GE(seconds, 0.15);
    EXPECT_LT(seconds, 1.2) << "must end at the abort, not when the stream "
                               "drains (1.5 s)";

    // Later calls fail at once quoting the first reason; Abort again is a
    // no-op.
    transport->Abort(absl::CancelledError("a second reason"));
    for (const absl::Status& later :
         {transport->GroupStart(),
          transport->Broadcast(data.get(), data.count(), DType::kFloat32, 0,
                               stream.get()),
          transport->Synchronize(stream.get(), absl::Seconds(1))}) {
      EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
      EXPECT_THAT(later.message(), HasSubstr("plan version 7 was replaced"));
      EXPECT_THAT(later.message(), ::testing::Not(HasSubstr("second")));
    }
  });
}

TEST_F(NcclTransportGpuTest,
       SynchronizeGivesDeadlineExceededAndAbortsWhenTheStreamStaysBusy) {
  WithinOrExit(absl::Seconds(60), "synchronize timeout", [] {
    std::unique_ptr<NcclTransport> transport = OneRank();
    ASSERT_NE(transport, nullptr);
    OwnedStream stream;
    ASSERT_CUDA(stream.error());
    DeviceFloats data(1024);
    ASSERT_CUDA(data.error());
    ASSERT_TRUE(transport
                    ->Broadcast(data.get(), data.count(), DType::kFloat32, 0,
                                stream.get())
                    .ok());
    ASSERT_CUDA(
        cudaLaunchHostFunc(stream.get(), SleepOneAndAHalfSeconds, nullptr));
    const Clock::time_point start = Clock::now();
    const absl::Status status =
        transport->Synchronize(stream.get(), absl::Milliseconds(200));
    const double seconds = SecondsSince(start);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("NCCL rank 0 of 1"),
                      HasSubstr("stream not done after 200ms")));
    // Ends at its timeout plus the abort's teardown, which may wait for the
    // stream where NCCL frees device memory (an implicit synchronization).
    std::printf("Synchronize timed out and aborted in %.3f s\n", seconds);
    EXPECT_GE(seconds, 0.19);
    EXPECT_LT(seconds, 5.0);
    const absl::Status later = transport->Broadcast(
        data.get(), data.count(), DType::kFloat32, 0, stream.get());
    EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
    EXPECT_THAT(later.message(),
                AllOf(HasSubstr("transport was aborted and must be rebuilt"),
                      HasSubstr("stream not done")));
  });
}

TEST_F(NcclTransportGpuTest, CommunicatorRebuiltWithAFreshIdAfterAnAbortWorks) {
  WithinOrExit(absl::Seconds(60), "rebuild after abort", [] {
    std::unique_ptr<NcclTransport> old = OneRank();
    ASSERT_NE(old, nullptr);
    old->Abort(absl::CancelledError("plan version 3 retired"));
    old.reset();
    std::unique_ptr<NcclTransport> rebuilt = OneRank();
    ASSERT_NE(rebuilt, nullptr);
    ExpectGroupedBroadcastAndReduceSumOnOneRank(*rebuilt);
  });
}

TEST_F(NcclTransportGpuTest,
       CreateGivesDeadlineExceededWhenTheOtherRankNeverJoins) {
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclOptions options;
  options.timeout = absl::Seconds(1);
  absl::Status status;
  double seconds = 0;
  WithinOrExit(absl::Seconds(60), "Create with a missing rank", [&] {
    const Clock::time_point start = Clock::now();
    status = NcclTransport::Create(/*cuda_device=*/0, /*rank=*/0, /*size=*/2,
                                   *id, options)
                 .status();
    seconds = SecondsSince(start);
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("NCCL rank 0 of 2"),
                                      HasSubstr("waiting for 2 ranks")));
  EXPECT_GE(seconds, 0.95);
  EXPECT_LT(seconds, 10.0) << "the abort after the timeout must not hang";
}

// Two ranks' barrier that gives up after a while instead of hanging.
class TwoRankBarrier {
 public:
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return arrived_ >= 2; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
};

// One rank of a two-rank world on device `rank`: a grouped Send/Recv pair
// with the peer, a ReduceSum to rank 0 and a Broadcast from rank 1.
void RunRankOfTwo(int rank, const std::string& id,
                  std::unique_ptr<NcclTransport>* kept) {
  constexpr size_t kCount = size_t{1} << 20;
  const int peer = 1 - rank;
  NcclOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<NcclTransport>> created =
      NcclTransport::Create(/*cuda_device=*/rank, rank, /*size=*/2, id,
                            options);
  ASSERT_TRUE(created.ok()) << created.status();
  *kept = *std::move(created);
  NcclTransport& transport = **kept;
  OwnedStream stream;
  ASSERT_CUDA(stream.error());
  DeviceFloats outgoing(kCount), incoming(kCount), part(kCount), sum(kCount),
      broadcast(kCount);
  for (const DeviceFloats* buffer :
       {&outgoing, &incoming, &part, &sum, &broadcast}) {
    ASSERT_CUDA(buffer->error());
  }
  // Small integers and halves: every value and sum is exact in float.
  auto mine = [](int r) {
    return Ramp(kCount, 1e6f * static_cast<float>(r), 1);
  };
  auto part_of = [](int r) {
    return Ramp(kCount, 0, static_cast<float>(r + 1));
  };
  const std::vector<float> roots_broadcast = Ramp(kCount, 7, 0.5f);
  ASSERT_CUDA(outgoing.Upload(mine(rank)));
  ASSERT_CUDA(incoming.Upload(std::vector<float>(kCount, -1)));
  ASSERT_CUDA(part.Upload(part_of(rank)));
  ASSERT_CUDA(sum.Upload(std::vector<float>(kCount, -1)));
  ASSERT_CUDA(broadcast.Upload(rank == 1 ? roots_broadcast
                                         : std::vector<float>(kCount, -1)));

  ASSERT_TRUE(transport.GroupStart().ok());
  ASSERT_TRUE(transport
                  .Send(outgoing.get(), outgoing.count(), DType::kFloat32, peer,
                        stream.get())
                  .ok());
  ASSERT_TRUE(transport
                  .Recv(incoming.get(), incoming.count(), DType::kFloat32, peer,
                        stream.get())
                  .ok());
  absl::Status status = transport.GroupEnd();
  ASSERT_TRUE(status.ok()) << status;
  const int order[] = {1, 0};  // Checked, then NCCL's own order.
  status = transport.ReduceSum(part.get(), rank == 0 ? sum.get() : nullptr,
                               kCount, /*root=*/0, order, stream.get());
  ASSERT_TRUE(status.ok()) << status;
  status =
      transport.Broadcast(broadcast.get(), broadcast.count(), DType::kFloat32,
                          /*root=*/1, stream.get());
  ASSERT_TRUE(status.ok()) << status;
  status = transport.Synchronize(stream.get(), absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status;

  std::vector<float> got;
  ASSERT_CUDA(incoming.Download(&got));
  EXPECT_EQ(got, mine(peer)) << "rank " << rank;
  if (rank == 0) {
    ASSERT_CUDA(sum.Download(&got));
    std::vector<float> expected = part_of(0);
    const std::vector<float> other = part_of(1);
    for (size_t i = 0; i < kCount; ++i) expected[i] += other[i];
    EXPECT_EQ(got, expected);
  }
  ASSERT_CUDA(broadcast.Download(&got));
  EXPECT_EQ(got, roots_broadcast) << "rank " << rank;
}

TEST_F(NcclTransportGpuTest,
       TwoRanksOnTwoGpusExchangeSendRecvReduceSumAndBroadcast) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << devices_;
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  WithinOrExit(absl::Seconds(180), "two-rank exchange", [&] {
    TwoRankBarrier before_teardown;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        std::unique_ptr<NcclTransport> transport;
        RunRankOfTwo(rank, *id, &transport);
        // Both ranks finish their calls before either finalizes.
        before_teardown.Arrive();
        const Clock::time_point start = Clock::now();
        transport.reset();
        EXPECT_LT(SecondsSince(start), 5.0)
            << "rank " << rank << ": destroying a healthy transport";
      });
    }
    for (std::thread& thread : ranks) thread.join();
  });
}

// What a worker with no trainer does between steps: AwaitFrom times out
// while the peer sends nothing (the transport stays usable), returns once
// the peer's message arrived, and the next Recvs take that message and the
// one after it, in order. A transport destroyed with an awaited receive
// still posted is aborted at once, not finalized for options.timeout.
TEST_F(NcclTransportGpuTest,
       TwoRanksAwaitFromWaitsWithoutLosingTheMessageAndTearsDownPromptly) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << devices_;
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr size_t kCount = 4;
  const std::vector<float> first = {1, 2, 3, 4}, second = {5, 6, 7, 8};
  WithinOrExit(absl::Seconds(180), "two-rank AwaitFrom", [&] {
    TwoRankBarrier idle_seen, received, second_idle_seen;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        NcclOptions options;
        options.timeout = absl::Seconds(30);
        absl::StatusOr<std::unique_ptr<NcclTransport>> created =
            NcclTransport::Create(/*cuda_device=*/rank, rank, /*size=*/2, *id,
                                  options);
        ASSERT_TRUE(created.ok()) << created.status();
        std::unique_ptr<NcclTransport> transport = *std::move(created);
        OwnedStream stream;
        ASSERT_CUDA(stream.error());
        DeviceFloats a(kCount), b(kCount);
        ASSERT_CUDA(a.error());
        ASSERT_CUDA(b.error());
        if (rank == 0) {
          ASSERT_CUDA(a.Upload(first));
          ASSERT_CUDA(b.Upload(second));
          idle_seen.Arrive();  // rank 1 has timed out once
          ASSERT_TRUE(
              transport
                  ->Send(a.get(), a.count(), DType::kFloat32, 1, stream.get())
                  .ok());
          ASSERT_TRUE(
              transport
                  ->Send(b.get(), b.count(), DType::kFloat32, 1, stream.get())
                  .ok());
          const absl::Status synced =
              transport->Synchronize(stream.get(), absl::Seconds(30));
          ASSERT_TRUE(synced.ok()) << synced;
          received.Arrive();
          second_idle_seen.Arrive();
          transport.reset();
          return;
        }
        const absl::Status idle = transport->AwaitFrom(
            0, a.count(), DType::kFloat32, absl::Milliseconds(50));
        EXPECT_EQ(idle.code(), absl::StatusCode::kDeadlineExceeded) << idle;
        idle_seen.Arrive();
        const absl::Status woken = transport->AwaitFrom(
            0, a.count(), DType::kFloat32, absl::Seconds(30));
        ASSERT_TRUE(woken.ok()) << woken;
        // Waiting again before the Recv is a no-op.
        ASSERT_TRUE(
            transport
                ->AwaitFrom(0, a.count(), DType::kFloat32, absl::Seconds(1))
                .ok());
        ASSERT_TRUE(
            transport
                ->Recv(a.get(), a.count(), DType::kFloat32, 0, stream.get())
                .ok());
        ASSERT_TRUE(
            transport
                ->Recv(b.get(), b.count(), DType::kFloat32, 0, stream.get())
                .ok());
        const absl::Status synced =
            transport->Synchronize(stream.get(), absl::Seconds(30));
        ASSERT_TRUE(synced.ok()) << synced;
        std::vector<float> got;
        ASSERT_CUDA(a.Download(&got));
        EXPECT_EQ(got, first);
        ASSERT_CUDA(b.Download(&got));
        EXPECT_EQ(got, second);
        received.Arrive();
        // A wait nobody answers: posted, timed out, then torn down.
        const absl::Status unanswered = transport->AwaitFrom(
            0, a.count(), DType::kFloat32, absl::Milliseconds(50));
        EXPECT_EQ(unanswered.code(), absl::StatusCode::kDeadlineExceeded)
            << unanswered;
        second_idle_seen.Arrive();
        const Clock::time_point start = Clock::now();
        transport.reset();
        EXPECT_LT(SecondsSince(start), 5.0)
            << "destroying a transport with an awaited receive posted";
      });
    }
    for (std::thread& thread : ranks) thread.join();
  });
}

// Both splits on one rank: FormSplit splits a communicator of its own for
// each (one group of every rank gets one too), BroadcastIn and ReduceSumIn
// run on them in the same NCCL group as this communicator's calls, the
// values exact; each split forms once; a healthy transport with the
// splits' communicators finalizes them all at once, and an aborted one
// aborts them all.
TEST_F(NcclTransportGpuTest, OneRankSplitsBroadcastAndSumOnSplitCommunicators) {
  constexpr size_t kCount = 100000;
  std::unique_ptr<NcclTransport> transport = OneRank();
  ASSERT_NE(transport, nullptr);
  EXPECT_TRUE(transport->group(Split::kOwnerGroups).empty());
  EXPECT_TRUE(transport->group(Split::kRails).empty());
  absl::Status formed = transport->FormSplit(Split::kOwnerGroups, {{0}});
  ASSERT_TRUE(formed.ok()) << formed;
  EXPECT_THAT(transport->group(Split::kOwnerGroups), ::testing::ElementsAre(0));
  EXPECT_TRUE(transport->group(Split::kRails).empty());
  formed = transport->FormSplit(Split::kRails, {{0}});
  ASSERT_TRUE(formed.ok()) << formed;
  EXPECT_THAT(transport->group(Split::kRails), ::testing::ElementsAre(0));
  const absl::Status again = transport->FormSplit(Split::kRails, {{0}});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(std::string(again.message()),
              HasSubstr("FormSplit(rails): formed already"));
  OwnedStream stream;
  ASSERT_CUDA(stream.error());
  DeviceFloats among_owners(kCount), everyone(kCount), on_rail(kCount),
      summed(kCount), send(kCount);
  ASSERT_CUDA(among_owners.error());
  ASSERT_CUDA(everyone.error());
  ASSERT_CUDA(on_rail.error());
  ASSERT_CUDA(summed.error());
  ASSERT_CUDA(send.error());
  const std::vector<float> a = Ramp(kCount, 3.0f, 0.5f);
  const std::vector<float> b = Ramp(kCount, -1.0f, 0.25f);
  const std::vector<float> c = Ramp(kCount, 5.0f, -0.75f);
  const std::vector<float> d = Ramp(kCount, 0.5f, 2.0f);
  ASSERT_CUDA(among_owners.Upload(a));
  ASSERT_CUDA(everyone.Upload(b));
  ASSERT_CUDA(on_rail.Upload(c));
  ASSERT_CUDA(send.Upload(d));
  for (int round = 0; round < 2; ++round) {
    ASSERT_CUDA(summed.Upload(std::vector<float>(kCount, -7.0f)));
    ASSERT_TRUE(transport->GroupStart().ok());
    absl::Status status =
        transport->BroadcastIn(Split::kOwnerGroups, among_owners.get(), kCount,
                               DType::kFloat32, /*root=*/0, stream.get());
    ASSERT_TRUE(status.ok()) << status;
    status = transport->Broadcast(everyone.get(), kCount, DType::kFloat32,
                                  /*root=*/0, stream.get());
    ASSERT_TRUE(status.ok()) << status;
    // A sum over a group of one: its own part, in place and into another
    // buffer.
    status = transport->ReduceSumIn(Split::kRails, on_rail.get(), on_rail.get(),
                                    kCount, /*root=*/0,
                                    /*order=*/{}, stream.get());
    ASSERT_TRUE(status.ok()) << status;
    const int order[] = {0};
    status = transport->ReduceSumIn(Split::kRails, send.get(), summed.get(),
                                    kCount, /*root=*/0, order, stream.get());
    ASSERT_TRUE(status.ok()) << status;
    status = transport->GroupEnd();
    ASSERT_TRUE(status.ok()) << status;
    status = transport->Synchronize(stream.get(), absl::Seconds(10));
    ASSERT_TRUE(status.ok()) << status;
    std::vector<float> got;
    ASSERT_CUDA(among_owners.Download(&got));
    EXPECT_EQ(got, a);
    ASSERT_CUDA(everyone.Download(&got));
    EXPECT_EQ(got, b);
    ASSERT_CUDA(on_rail.Download(&got));
    EXPECT_EQ(got, c);
    ASSERT_CUDA(summed.Download(&got));
    EXPECT_EQ(got, d);
  }
  // A root outside the group breaks the transport, naming the call.
  const absl::Status outside =
      transport->BroadcastIn(Split::kOwnerGroups, among_owners.get(), kCount,
                             DType::kFloat32, /*root=*/1, stream.get());
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;
  EXPECT_THAT(std::string(outside.message()),
              HasSubstr("BroadcastIn(owner groups): root 1"));

  // An order that is not a permutation of the rail's members, too.
  std::unique_ptr<NcclTransport> disordered = OneRank();
  ASSERT_NE(disordered, nullptr);
  ASSERT_TRUE(disordered->FormSplit(Split::kRails, {{0}}).ok());
  const int wrong[] = {0, 0};
  const absl::Status order =
      disordered->ReduceSumIn(Split::kRails, send.get(), summed.get(), kCount,
                              /*root=*/0, wrong, stream.get());
  EXPECT_EQ(order.code(), absl::StatusCode::kInvalidArgument) << order;
  EXPECT_THAT(std::string(order.message()),
              AllOf(HasSubstr("ReduceSumIn(rails): order is not a permutation"),
                    HasSubstr("NCCL rank 0 of 1")));

  // Healthy: destroyed (every communicator finalized) at once.
  std::unique_ptr<NcclTransport> healthy = OneRank();
  ASSERT_NE(healthy, nullptr);
  ASSERT_TRUE(healthy->FormSplit(Split::kOwnerGroups, {{0}}).ok());
  ASSERT_TRUE(healthy->FormSplit(Split::kRails, {{0}}).ok());
  Clock::time_point start = Clock::now();
  healthy.reset();
  EXPECT_LT(SecondsSince(start), 5.0) << "destroying a healthy transport";
  // Aborted: later calls fail, quoting the reason; destroyed at once.
  std::unique_ptr<NcclTransport> aborted = OneRank();
  ASSERT_NE(aborted, nullptr);
  ASSERT_TRUE(aborted->FormSplit(Split::kOwnerGroups, {{0}}).ok());
  ASSERT_TRUE(aborted->FormSplit(Split::kRails, {{0}}).ok());
  aborted->Abort(absl::UnavailableError("plan replaced"));
  const absl::Status after = aborted->ReduceSumIn(
      Split::kRails, send.get(), summed.get(), kCount, 0, {}, stream.get());
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_THAT(std::string(after.message()), HasSubstr("plan replaced"));
  start = Clock::now();
  aborted.reset();
  EXPECT_LT(SecondsSince(start), 5.0) << "destroying an aborted transport";
}

// Two ranks on two GPUs in two owner groups of one and one rail of both:
// each broadcasts in its own group (nothing crosses) while the two exchange
// in the same NCCL group over the communicator of both, and sum their
// parts onto rank 1 over the rail's communicator (in NCCL's order; the
// integers make every order exact).
TEST_F(NcclTransportGpuTest, TwoOwnerGroupsOfOneBroadcastApartAndSumOnARail) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << devices_;
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr size_t kCount = size_t{1} << 20;
  WithinOrExit(absl::Seconds(180), "two owner groups", [&] {
    TwoRankBarrier before_teardown;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        NcclOptions options;
        options.timeout = absl::Seconds(30);
        absl::StatusOr<std::unique_ptr<NcclTransport>> created =
            NcclTransport::Create(rank, rank, 2, *id, options);
        ASSERT_TRUE(created.ok()) << created.status();
        NcclTransport& t = **created;
        // Listed in another order than the ranks: groups are by index.
        absl::Status status = t.FormSplit(Split::kOwnerGroups, {{1}, {0}});
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_THAT(t.group(Split::kOwnerGroups), ::testing::ElementsAre(rank));
        status = t.FormSplit(Split::kRails, {{1, 0}});
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_THAT(t.group(Split::kRails), ::testing::ElementsAre(0, 1));
        OwnedStream stream;
        ASSERT_CUDA(stream.error());
        DeviceFloats own(kCount), out(kCount), in(kCount), part(kCount),
            sum(kCount);
        const std::vector<float> mine = Ramp(kCount, 100.0f * rank, 1);
        ASSERT_CUDA(own.Upload(mine));
        ASSERT_CUDA(out.Upload(mine));
        ASSERT_CUDA(part.Upload(mine));
        ASSERT_CUDA(in.Upload(std::vector<float>(kCount, -1)));
        ASSERT_CUDA(sum.Upload(std::vector<float>(kCount, -1)));
        ASSERT_TRUE(t.GroupStart().ok());
        status = t.BroadcastIn(Split::kOwnerGroups, own.get(), kCount,
                               DType::kFloat32, rank, stream.get());
        ASSERT_TRUE(status.ok()) << status;
        ASSERT_TRUE(
            t.Send(out.get(), kCount, DType::kFloat32, 1 - rank, stream.get())
                .ok());
        ASSERT_TRUE(
            t.Recv(in.get(), kCount, DType::kFloat32, 1 - rank, stream.get())
                .ok());
        const int order[] = {1, 0};
        status = t.ReduceSumIn(Split::kRails, part.get(), sum.get(), kCount,
                               /*root=*/1, order, stream.get());
        ASSERT_TRUE(status.ok()) << status;
        status = t.GroupEnd();
        ASSERT_TRUE(status.ok()) << status;
        status = t.Synchronize(stream.get(), absl::Seconds(30));
        ASSERT_TRUE(status.ok()) << status;
        std::vector<float> got;
        ASSERT_CUDA(own.Download(&got));
        EXPECT_EQ(got, mine);
        ASSERT_CUDA(in.Download(&got));
        EXPECT_EQ(got, Ramp(kCount, 100.0f * (1 - rank), 1));
        if (rank == 1) {
          std::vector<float> expected = Ramp(kCount, 0.0f, 1);
          const std::vector<float> other = Ramp(kCount, 100.0f, 1);
          for (size_t i = 0; i < kCount; ++i) expected[i] += other[i];
          ASSERT_CUDA(sum.Download(&got));
          EXPECT_EQ(got, expected);
        }
        before_teardown.Arrive();
        created->reset();
      });
    }
    for (std::thread& thread : ranks) thread.join();
  });
}

}  // namespace
}  // namespace transport
}  // namespace muonps
