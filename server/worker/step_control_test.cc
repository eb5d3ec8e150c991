// ControlChannel's Gather over a real transport (TCP ranks as threads of
// this process): every rank's message reaches the root by rank, in one
// group, whichever rank is the root. And over a host transport beside a
// device one (transport/split_transport.h): a message leaves only after
// the device's stream is done, and not at all when that wait fails.
#include "server/worker/step_control.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "transport/accepting_transport.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

struct Message {
  int64_t step;
  int32_t rank;
  int32_t yes;
};

TEST(ControlChannelTest, GatherBringsEveryRanksMessageToTheRootByRank) {
  constexpr int kWorld = 3;
  for (int root = 0; root < kWorld; ++root) {
    auto world = transport::ConnectLoopbackWorld(kWorld, /*session=*/41 + root,
                                                 transport::LoopbackOptions());
    ASSERT_TRUE(world.ok()) << world.status();
    std::vector<std::vector<Message>> got(kWorld);
    std::vector<absl::Status> status(kWorld);
    transport::RunOnEveryRank(kWorld, [&](int rank) {
      kernels::CpuDeviceOps ops;
      ControlChannel control((*world)[rank].get(), &ops, /*scratch=*/nullptr,
                             absl::Seconds(10));
      got[rank] = {Message{-7, -7, -7}};  // left as it is off the root
      status[rank] =
          control.Gather(Message{100 + rank, rank, rank % 2}, &got[rank], root);
    });
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << "rank " << rank << ": " << status[rank];
      if (rank != root) {
        ASSERT_EQ(got[rank].size(), 1u);
        EXPECT_EQ(got[rank][0].step, -7);
        continue;
      }
      ASSERT_EQ(got[rank].size(), static_cast<size_t>(kWorld));
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(got[rank][r].step, 100 + r) << "root " << root;
        EXPECT_EQ(got[rank][r].rank, r);
        EXPECT_EQ(got[rank][r].yes, r % 2);
      }
    }
  }
}

// What the calls of a step did, in order.
using Log = std::vector<std::string>;

// A transport that logs its calls and moves nothing: the data transport of
// a device (Synchronize answers `sync`), or the host one beside it.
class LoggingTransport : public transport::AcceptingTransport {
 public:
  LoggingTransport(const char* name, MemoryKind memory, Log* log,
                   absl::Status sync = absl::OkStatus(),
                   transport::Transport* control = nullptr)
      : AcceptingTransport(0, 2, absl::OkStatus(), memory),
        name_(name),
        log_(log),
        sync_(std::move(sync)),
        control_(control) {}
  absl::Status Send(const void*, size_t, DType, int peer,
                    Stream stream) override {
    log_->push_back(absl::StrCat(name_, " send to ", peer,
                                 stream == kHostStream ? " (host)" : ""));
    return absl::OkStatus();
  }
  absl::Status Synchronize(Stream, absl::Duration timeout) override {
    log_->push_back(absl::StrCat(name_, " synchronize within ",
                                 absl::FormatDuration(timeout)));
    return sync_;
  }
  transport::Transport* control() override {
    return control_ != nullptr ? control_ : this;
  }

 private:
  const char* const name_;
  Log* const log_;
  const absl::Status sync_;
  transport::Transport* const control_;
};

// Device ops that say they are a GPU's (what ControlChannel asks) and
// take no other call here: messages over a host transport touch no device
// memory.
class GpuLikeOps : public kernels::DeviceOps {
 public:
  Device device() const override { return Device{MemoryKind::kCuda, 0}; }
  Stream stream() const override { return kStream; }
  Stream compute_stream() const override { return kStream; }
  absl::StatusOr<int> Mark(Stream) override { return Unused(); }
  absl::Status WaitForMark(Stream, int) override { return Unused(); }
  absl::StatusOr<std::vector<double>> MarkTimesMs() override {
    return Unused();
  }
  void ClearMarks() override {}
  absl::StatusOr<std::unique_ptr<kernels::FloatBuffer>> Allocate(
      int64_t, const char*) override {
    return Unused();
  }
  absl::Status Copy(float*, const float*, int64_t, Stream) override {
    return Unused();
  }
  absl::Status CopyBytes(void*, const void*, int64_t, Stream) override {
    return Unused();
  }
  absl::Status ToFloat(float*, const void*, DType, int64_t, Stream) override {
    return Unused();
  }
  absl::Status FromFloat(void*, DType, const float*, int64_t, Stream) override {
    return Unused();
  }
  absl::Status Scale(float*, int64_t, float, Stream) override {
    return Unused();
  }
  absl::Status ApplyScaled(void*, DType, const void*, DType, int64_t, float,
                           float, Stream) override {
    return Unused();
  }
  absl::Status PrepareFiniteChecks(int64_t, Stream) override {
    return Unused();
  }
  absl::Status CheckFinite(absl::Span<const kernels::FloatSpan>, int64_t,
                           Stream) override {
    return Unused();
  }
  absl::StatusOr<std::vector<int64_t>> FiniteResults(int64_t, Stream) override {
    return Unused();
  }
  absl::Status Synchronize(Stream) override { return Unused(); }

 private:
  // A stream handle that is not the host's.
  static inline Stream const kStream = reinterpret_cast<Stream>(uintptr_t{1});
  static absl::Status Unused() {
    return absl::UnimplementedError("not a call of a host-transport message");
  }
};

TEST(ControlChannelTest, OverAHostTransportAMessageWaitsForTheStreamFirst) {
  Log log;
  LoggingTransport tcp("tcp", MemoryKind::kHost, &log);
  LoggingTransport nccl("nccl", MemoryKind::kCuda, &log, absl::OkStatus(),
                        &tcp);
  GpuLikeOps ops;
  ControlChannel control(&nccl, &ops, /*scratch=*/nullptr, absl::Seconds(3));
  ASSERT_TRUE(control.Send(Message{1, 0, 1}, 1).ok());
  EXPECT_EQ(log, (Log{"nccl synchronize within 3s", "tcp send to 1 (host)"}));
}

TEST(ControlChannelTest, AStreamThatDoesNotFinishSendsNoMessage) {
  Log log;
  LoggingTransport tcp("tcp", MemoryKind::kHost, &log);
  LoggingTransport nccl(
      "nccl", MemoryKind::kCuda, &log,
      absl::DeadlineExceededError("rank 1's transfer did not finish"), &tcp);
  GpuLikeOps ops;
  ControlChannel control(&nccl, &ops, /*scratch=*/nullptr, absl::Seconds(3));
  const absl::Status sent = control.Send(Message{1, 0, 1}, 1);
  EXPECT_TRUE(absl::IsDeadlineExceeded(sent)) << sent;
  EXPECT_EQ(log, (Log{"nccl synchronize within 3s"}));
}

}  // namespace
}  // namespace worker
}  // namespace muonps
