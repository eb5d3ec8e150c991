// ControlChannel's Gather and Broadcast over real transports (TCP ranks as
// threads of this process) of every shape, full meshes and trees: every
// rank's message reaches rank 0 by rank, and a broadcast from any rank
// reaches every rank. And over a host transport beside a
// device one (transport/split_transport.h): a message leaves only after
// the device's stream is done, and not at all when that wait fails.
#include "server/worker/step_control.h"

#include <cstdint>
#include <functional>
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

// Ranks of a real TCP mesh (threads of this process) of `shape`, `world`
// of them, each with a ControlChannel, running `body` on every rank.
void OnEveryChannel(
    int world, transport::MeshShape shape, uint64_t session,
    const std::function<void(int rank, ControlChannel& control)>& body) {
  transport::TcpOptions options = transport::LoopbackOptions();
  options.shape = shape;
  auto ranks = transport::ConnectLoopbackWorld(world, session, options);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  transport::RunOnEveryRank(world, [&](int rank) {
    kernels::CpuDeviceOps ops;
    ControlChannel control((*ranks)[rank].get(), &ops, /*scratch=*/nullptr,
                           absl::Seconds(10));
    body(rank, control);
  });
}

struct Shape {
  int world;
  transport::MeshShape mesh;
};

// A star of a full mesh, a star of a tree mesh, a chain and a tree of
// depth 3.
const Shape kShapes[] = {
    {3, transport::MeshShape::Full()},
    {5, transport::MeshShape::Tree(kControlTreeFanout)},
    {4, transport::MeshShape::Tree(1)},
    {11, transport::MeshShape::Tree(2)},
};

TEST(ControlChannelTest, GatherBringsEveryRanksMessageToRankZeroByRank) {
  uint64_t session = 40;
  for (const Shape& shape : kShapes) {
    std::vector<std::vector<Message>> got(shape.world);
    std::vector<absl::Status> status(shape.world);
    OnEveryChannel(
        shape.world, shape.mesh, ++session,
        [&](int rank, ControlChannel& control) {
          got[rank] = {Message{-7, -7, -7}};  // left as it is off rank 0
          status[rank] =
              control.Gather(Message{100 + rank, rank, rank % 2}, &got[rank]);
        });
    for (int rank = 0; rank < shape.world; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << "rank " << rank << ": " << status[rank];
      if (rank != 0) {
        ASSERT_EQ(got[rank].size(), 1u);
        EXPECT_EQ(got[rank][0].step, -7);
        continue;
      }
      ASSERT_EQ(got[rank].size(), static_cast<size_t>(shape.world));
      for (int r = 0; r < shape.world; ++r) {
        EXPECT_EQ(got[rank][r].step, 100 + r) << shape.world;
        EXPECT_EQ(got[rank][r].rank, r);
        EXPECT_EQ(got[rank][r].yes, r % 2);
      }
    }
  }
}

TEST(ControlChannelTest, BroadcastFromAnyRankReachesEveryRank) {
  uint64_t session = 50;
  for (const Shape& shape : kShapes) {
    std::vector<absl::Status> status(shape.world);
    OnEveryChannel(shape.world, shape.mesh, ++session,
                   [&](int rank, ControlChannel& control) {
                     for (int root = 0; root < shape.world; ++root) {
                       Message m = rank == root ? Message{200 + root, root, 1}
                                                : Message{-1, -1, -1};
                       bool arrived = false;
                       status[rank] = control.Broadcast(&m, root, &arrived);
                       if (!status[rank].ok()) return;
                       EXPECT_TRUE(arrived);
                       EXPECT_EQ(m.step, 200 + root) << "rank " << rank;
                       EXPECT_EQ(m.rank, root);
                       // An array of them, as the handover's lists travel.
                       std::vector<int32_t> list(5 + root,
                                                 rank == root ? root : -1);
                       status[rank] = control.BroadcastBytes(
                           list.data(), list.size() * sizeof(int32_t), root);
                       if (!status[rank].ok()) return;
                       EXPECT_EQ(list, std::vector<int32_t>(5 + root, root));
                     }
                   });
    for (int rank = 0; rank < shape.world; ++rank) {
      EXPECT_TRUE(status[rank].ok()) << "rank " << rank << ": " << status[rank];
    }
  }
}

// A rank of a chain 0 - 1 - 2 whose child is gone: the broadcast arrived
// (it says so, and the message is there) though passing it on failed.
TEST(ControlChannelTest, ARankThatCouldNotPassItOnStillHasIt) {
  transport::TcpOptions options = transport::LoopbackOptions();
  options.shape = transport::MeshShape::Tree(1);
  options.io_timeout = absl::Seconds(2);
  auto ranks = transport::ConnectLoopbackWorld(3, /*session=*/61, options);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  (*ranks)[2].reset();  // closes its connection to rank 1
  // Larger than the socket buffers: the write meets the closed connection.
  constexpr size_t kInts = size_t{4} << 20;
  std::vector<absl::Status> status(2);
  std::vector<int32_t> got;
  bool arrived = false;
  transport::RunOnEveryRank(2, [&](int rank) {
    kernels::CpuDeviceOps ops;
    ControlChannel control((*ranks)[rank].get(), &ops, /*scratch=*/nullptr,
                           absl::Seconds(2));
    std::vector<int32_t> m(kInts, rank == 0 ? 7 : -1);
    status[rank] = control.BroadcastBytes(m.data(), kInts * sizeof(int32_t), 0,
                                          rank == 1 ? &arrived : nullptr);
    if (rank == 1) got = std::move(m);
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_FALSE(status[1].ok());
  EXPECT_TRUE(arrived);
  EXPECT_EQ(got, std::vector<int32_t>(kInts, 7));
}

TEST(ControlChannelTest, ABroadcastFromNoRankIsRefused) {
  OnEveryChannel(2, transport::MeshShape::Full(), 70,
                 [&](int, ControlChannel& control) {
                   Message m{};
                   const absl::Status s = control.Broadcast(&m, 2);
                   EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
                 });
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
