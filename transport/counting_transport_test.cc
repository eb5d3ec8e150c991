#include "transport/counting_transport.h"

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "transport/accepting_transport.h"

namespace muonps {
namespace transport {
namespace {

struct Totals {
  double sent = 0, received = 0;
};

// Runs the same calls on every rank of a `size`-rank world, each with its
// own registry, and returns each rank's sent and received totals.
template <typename Calls>
std::vector<Totals> RunOnWorld(int size, Calls calls) {
  std::vector<Totals> totals;
  for (int r = 0; r < size; ++r) {
    MetricsRegistry registry;
    const TransportCounters counters = AddTransportCounters(&registry);
    CountingTransport t(std::make_unique<AcceptingTransport>(r, size),
                        counters);
    calls(t);
    Totals rank;
    for (const char* op : {"send", "recv", "reduce", "broadcast"}) {
      rank.sent += counters.sent->Value({op});
      rank.received += counters.received->Value({op});
    }
    totals.push_back(rank);
  }
  return totals;
}

TEST(CountingTransportTest, TwoRanksCountExactlyWhatEachSendsAndReceives) {
  const auto totals = RunOnWorld(2, [](Transport& t) {
    float x[4] = {};
    // Rank 1 sends 16 bytes to the root 0; root 0 broadcasts 8 bytes (two
    // fp32) and sends 12 (six bf16): the counters stay in bytes.
    ASSERT_TRUE(t.ReduceSum(x, x, 4, 0, {}, kHostStream).ok());
    ASSERT_TRUE(t.Broadcast(x, 2, DType::kFloat32, 0, kHostStream).ok());
    if (t.rank() == 0) {
      ASSERT_TRUE(t.Send(x, 6, DType::kBFloat16, 1, kHostStream).ok());
    } else {
      ASSERT_TRUE(t.Recv(x, 6, DType::kBFloat16, 0, kHostStream).ok());
    }
  });
  EXPECT_EQ(totals[0].sent, 8 + 12);
  EXPECT_EQ(totals[0].received, 16);
  EXPECT_EQ(totals[1].sent, 16);
  EXPECT_EQ(totals[1].received, 8 + 12);
}

TEST(CountingTransportTest, CollectivesMoveSizeMinusOneCopiesEachWay) {
  for (int size : {1, 3, 4}) {
    for (int root = 0; root < size; ++root) {
      const auto totals = RunOnWorld(size, [root](Transport& t) {
        float x[25] = {};
        ASSERT_TRUE(t.ReduceSum(x, x, 25, root, {}, kHostStream).ok());
        // 100 bytes, as fp16.
        ASSERT_TRUE(
            t.Broadcast(x, 50, DType::kFloat16, root, kHostStream).ok());
      });
      double sent = 0, received = 0;
      for (const Totals& r : totals) {
        sent += r.sent;
        received += r.received;
        EXPECT_LE(r.sent, 200);
      }
      EXPECT_EQ(sent, 2 * 100 * (size - 1)) << "size " << size;
      EXPECT_EQ(received, 2 * 100 * (size - 1)) << "size " << size;
      // The root sends only its broadcast, when there is anyone to send to.
      EXPECT_EQ(totals[root].sent, size > 1 ? 100 : 0);
      EXPECT_EQ(totals[root].received, size > 1 ? 100 : 0);
    }
  }
}

TEST(CountingTransportTest, AnOwnerGroupsBroadcastMovesItsMembersCopiesOnly) {
  // 5 ranks in groups {1, 3, 4} and {0, 2}: a broadcast of 100 bytes from
  // 3 in the first and from 0 in the second moves 2 and 1 copies each way,
  // as chains over the members (3 -> 4 -> 1 and 0 -> 2).
  const auto totals = RunOnWorld(5, [](Transport& t) {
    ASSERT_TRUE(t.FormSplit(Split::kOwnerGroups, {{4, 1, 3}, {2, 0}}).ok());
    const int root = t.group(Split::kOwnerGroups).size() == 3 ? 3 : 0;
    float x[25] = {};
    ASSERT_TRUE(t.BroadcastIn(Split::kOwnerGroups, x, 50, DType::kFloat16, root,
                              kHostStream)
                    .ok());
  });
  const double sent[] = {100, 0, 0, 100, 100};
  const double received[] = {0, 100, 100, 0, 100};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(totals[r].sent, sent[r]) << "rank " << r;
    EXPECT_EQ(totals[r].received, received[r]) << "rank " << r;
  }
  // Without the split formed it is Broadcast over every rank.
  const auto every = RunOnWorld(3, [](Transport& t) {
    float x[25] = {};
    ASSERT_TRUE(
        t.BroadcastIn(Split::kRails, x, 50, DType::kFloat16, 1, kHostStream)
            .ok());
  });
  EXPECT_EQ(every[1].sent, 100);
  EXPECT_EQ(every[0].sent, 0);  // the chain 1 -> 2 -> 0 ends at 0
  EXPECT_EQ(every[0].received + every[2].received, 200);
}

TEST(CountingTransportTest, ARailsSumMovesItsMembersCopiesOnly) {
  // 5 ranks with owner groups {0, 1, 2, 3, 4} and rails {1, 3, 4} and
  // {0, 2}: a sum of 25 floats (100 bytes) onto 3 in the first rail and
  // onto 0 in the second moves 2 and 1 copies each way, as chains over
  // the members ending at the root (4 -> 1 -> 3 and 2 -> 0).
  const auto totals = RunOnWorld(5, [](Transport& t) {
    ASSERT_TRUE(t.FormSplit(Split::kOwnerGroups, {{0, 1, 2, 3, 4}}).ok());
    ASSERT_TRUE(t.FormSplit(Split::kRails, {{4, 1, 3}, {2, 0}}).ok());
    const int root = t.group(Split::kRails).size() == 3 ? 3 : 0;
    const int order[] = {3, 1, 4};
    float x[25] = {};
    ASSERT_TRUE(t.ReduceSumIn(Split::kRails, x, x, 25, root,
                              root == 3 ? absl::Span<const int>(order)
                                        : absl::Span<const int>(),
                              kHostStream)
                    .ok());
  });
  const double sent[] = {0, 100, 100, 0, 100};
  const double received[] = {100, 100, 0, 100, 0};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(totals[r].sent, sent[r]) << "rank " << r;
    EXPECT_EQ(totals[r].received, received[r]) << "rank " << r;
  }
  // Without the split formed it is ReduceSum over every rank, counted as
  // one call and one launch.
  MetricsRegistry registry;
  const TransportCounters counters = AddTransportCounters(&registry);
  CountingTransport t(std::make_unique<AcceptingTransport>(1, 3), counters);
  float x[25] = {};
  ASSERT_TRUE(t.ReduceSumIn(Split::kRails, x, x, 25, 0, {}, kHostStream).ok());
  EXPECT_EQ(counters.calls->Value({"reduce"}), 1);
  EXPECT_EQ(counters.launches->Value(), 1);
  EXPECT_EQ(counters.sent->Value({"reduce"}), 100);
  EXPECT_EQ(counters.received->Value({"reduce"}), 0);  // the chain's first
}

TEST(CountingTransportTest, RefusedCallsCountNothing) {
  MetricsRegistry registry;
  const TransportCounters counters = AddTransportCounters(&registry);
  CountingTransport t(std::make_unique<AcceptingTransport>(
                          1, 2, absl::UnavailableError("peer 0 is gone")),
                      counters);
  float x[4] = {};
  EXPECT_FALSE(t.Send(x, 4, DType::kFloat32, 0, kHostStream).ok());
  EXPECT_FALSE(t.ReduceSum(x, x, 4, 0, {}, kHostStream).ok());
  EXPECT_FALSE(t.ReduceSumIn(Split::kRails, x, x, 4, 0, {}, kHostStream).ok());
  EXPECT_FALSE(t.Broadcast(x, 4, DType::kFloat32, 1, kHostStream).ok());
  EXPECT_EQ(counters.sent->Value({"send"}), 0);
  EXPECT_EQ(counters.sent->Value({"reduce"}), 0);
  EXPECT_EQ(counters.sent->Value({"broadcast"}), 0);
  EXPECT_NE(
      registry.RenderText().find("muonps_worker_transport_bytes_sent_total"),
      std::string::npos);
}

TEST(CountingTransportTest, CallsCountByOperationAndGroupsCountOneLaunch) {
  MetricsRegistry registry;
  const TransportCounters counters = AddTransportCounters(&registry);
  CountingTransport t(std::make_unique<AcceptingTransport>(0, 2), counters);
  float x[4] = {};
  // Two calls outside a group: two launches.
  ASSERT_TRUE(t.Broadcast(x, 4, DType::kFloat32, 0, kHostStream).ok());
  ASSERT_TRUE(t.Send(x, 4, DType::kFloat32, 1, kHostStream).ok());
  EXPECT_EQ(counters.launches->Value(), 2);
  // Three calls in nested groups: one launch, at the outermost GroupEnd.
  ASSERT_TRUE(t.GroupStart().ok());
  ASSERT_TRUE(t.Broadcast(x, 4, DType::kFloat32, 1, kHostStream).ok());
  ASSERT_TRUE(t.GroupStart().ok());
  ASSERT_TRUE(t.ReduceSum(x, x, 4, 0, {}, kHostStream).ok());
  ASSERT_TRUE(t.Recv(x, 4, DType::kFloat32, 1, kHostStream).ok());
  ASSERT_TRUE(t.GroupEnd().ok());
  EXPECT_EQ(counters.launches->Value(), 2);
  ASSERT_TRUE(t.GroupEnd().ok());
  EXPECT_EQ(counters.launches->Value(), 3);
  // An empty group and an empty call launch nothing.
  ASSERT_TRUE(t.GroupStart().ok());
  ASSERT_TRUE(t.GroupEnd().ok());
  ASSERT_TRUE(t.Send(x, 0, DType::kFloat32, 1, kHostStream).ok());
  EXPECT_EQ(counters.launches->Value(), 3);
  EXPECT_EQ(counters.calls->Value({"broadcast"}), 2);
  EXPECT_EQ(counters.calls->Value({"send"}), 1);
  EXPECT_EQ(counters.calls->Value({"reduce"}), 1);
  EXPECT_EQ(counters.calls->Value({"recv"}), 1);
}

}  // namespace
}  // namespace transport
}  // namespace muonps
