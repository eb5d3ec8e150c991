// ControlChannel's Gather over a real transport (TCP ranks as threads of
// this process): every rank's message reaches the root by rank, in one
// group, whichever rank is the root.
#include "server/worker/step_control.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
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

}  // namespace
}  // namespace worker
}  // namespace muonps
