// SplitTransport over two loopback TCP worlds of the same ranks: data calls
// travel on the first, control messages on the second, Abort breaks both,
// and a CountingTransport counts the control messages apart, with no
// launches.
#include "transport/split_transport.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "gtest/gtest.h"
#include "transport/counting_transport.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace transport {
namespace {

// Two ranks, each a split of a data and a control TCP transport.
std::vector<std::unique_ptr<Transport>> SplitWorld() {
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> data =
      ConnectLoopbackWorld(2, 1, LoopbackOptions());
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> control =
      ConnectLoopbackWorld(2, 2, LoopbackOptions());
  EXPECT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(control.ok()) << control.status();
  std::vector<std::unique_ptr<Transport>> world;
  if (!data.ok() || !control.ok()) return world;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<SplitTransport>> split =
        SplitTransport::Create(std::move((*data)[r]), std::move((*control)[r]));
    EXPECT_TRUE(split.ok()) << split.status();
    if (split.ok()) world.push_back(*std::move(split));
  }
  return world;
}

TEST(SplitTransportTest, DataAndControlTravelOnTheirOwnTransports) {
  std::vector<std::unique_ptr<Transport>> world = SplitWorld();
  ASSERT_EQ(world.size(), 2u);
  RunOnEveryRank(2, [&](int rank) {
    Transport& t = *world[rank];
    ASSERT_NE(t.control(), &t);
    float data[3] = {1, 2, 3};
    float message[2] = {7, 8};
    if (rank == 0) {
      // The control message first: it does not wait behind the data.
      ASSERT_TRUE(
          t.control()->Send(message, 2, DType::kFloat32, 1, kHostStream).ok());
      ASSERT_TRUE(t.Send(data, 3, DType::kFloat32, 1, kHostStream).ok());
    } else {
      float got[3] = {};
      float said[2] = {};
      ASSERT_TRUE(
          t.control()->AwaitFrom(0, 2, DType::kFloat32, absl::Seconds(5)).ok());
      ASSERT_TRUE(
          t.control()->Recv(said, 2, DType::kFloat32, 0, kHostStream).ok());
      ASSERT_TRUE(t.Recv(got, 3, DType::kFloat32, 0, kHostStream).ok());
      EXPECT_EQ(said[1], 8);
      EXPECT_EQ(got[2], 3);
    }
  });
}

TEST(SplitTransportTest, AbortBreaksBoth) {
  std::vector<std::unique_ptr<Transport>> world = SplitWorld();
  ASSERT_EQ(world.size(), 2u);
  world[0]->Abort(absl::CancelledError("plan version 2 replaced it"));
  float x = 0;
  const absl::Status data =
      world[0]->Send(&x, 1, DType::kFloat32, 1, kHostStream);
  const absl::Status control =
      world[0]->control()->Send(&x, 1, DType::kFloat32, 1, kHostStream);
  EXPECT_FALSE(data.ok());
  EXPECT_FALSE(control.ok());
  EXPECT_NE(control.message().find("replaced"), absl::string_view::npos)
      << control;
}

TEST(SplitTransportTest, ControlMustBeAHostTransportOfTheSameRanks) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> two =
      ConnectLoopbackWorld(2, 3, LoopbackOptions());
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(absl::IsInvalidArgument(
      SplitTransport::Create(std::move((*two)[0]), nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SplitTransport::Create(nullptr, std::move((*two)[1])).status()));
}

TEST(SplitTransportTest, ControlMessagesAreCountedWithoutLaunches) {
  std::vector<std::unique_ptr<Transport>> world = SplitWorld();
  ASSERT_EQ(world.size(), 2u);
  std::vector<MetricsRegistry> registries(2);
  std::vector<TransportCounters> counters;
  std::vector<std::unique_ptr<CountingTransport>> counted;
  for (int r = 0; r < 2; ++r) {
    counters.push_back(AddTransportCounters(&registries[r]));
    counted.push_back(
        std::make_unique<CountingTransport>(std::move(world[r]), counters[r]));
  }
  RunOnEveryRank(2, [&](int rank) {
    Transport& t = *counted[rank];
    float x[4] = {};
    if (rank == 0) {
      ASSERT_TRUE(
          t.control()->Send(x, 2, DType::kFloat32, 1, kHostStream).ok());
      ASSERT_TRUE(t.Send(x, 4, DType::kFloat32, 1, kHostStream).ok());
    } else {
      ASSERT_TRUE(
          t.control()->Recv(x, 2, DType::kFloat32, 0, kHostStream).ok());
      ASSERT_TRUE(t.Recv(x, 4, DType::kFloat32, 0, kHostStream).ok());
    }
  });
  // Both sends counted (8 + 16 bytes); only the data call launched.
  EXPECT_EQ(counters[0].sent->Value({"send"}), 24);
  EXPECT_EQ(counters[0].calls->Value({"send"}), 2);
  EXPECT_EQ(counters[0].launches->Value({}), 1);
  EXPECT_EQ(counters[1].received->Value({"recv"}), 24);
}

}  // namespace
}  // namespace transport
}  // namespace muonps
