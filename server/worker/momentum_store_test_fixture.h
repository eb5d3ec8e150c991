// Test support for MomentumStore's tests on host memory (CpuDeviceOps): a
// small job's layouts, values, and the calls a test repeats.
#ifndef MUONPS_SERVER_WORKER_MOMENTUM_STORE_TEST_FIXTURE_H_
#define MUONPS_SERVER_WORKER_MOMENTUM_STORE_TEST_FIXTURE_H_

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "server/worker/momentum_store.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {

// "a": two 2 x 3 experts, "b": one 4 x 2 matrix. Version `version` gives
// this worker (rank 0) the items listed, each shape in a stack of its own.
inline MomentumStacks Layout(int64_t version,
                             const std::vector<scheduler::ItemRef>& owned,
                             const std::string& checkpoint_dir = "",
                             int64_t checkpoint_every = 0) {
  MomentumStacks layout;
  layout.version = version;
  layout.rank = 0;
  layout.matrices = {{.name = "a", .rows = 2, .cols = 3, .experts = 2},
                     {.name = "b", .rows = 4, .cols = 2, .experts = 1}};
  layout.owners = {{1, 1}, {1}};
  MomentumStack a, b;
  a.rows = 2, a.cols = 3, b.rows = 4, b.cols = 2;
  for (const scheduler::ItemRef& item : owned) {
    layout.owners[item.matrix][item.expert] = 0;
    (item.matrix == 0 ? a : b).items.push_back(item);
  }
  if (!a.items.empty()) layout.stacks.push_back(std::move(a));
  if (!b.items.empty()) layout.stacks.push_back(std::move(b));
  layout.checkpoint_dir = checkpoint_dir;
  layout.checkpoint_every = checkpoint_every;
  return layout;
}

inline std::vector<float> Values(int64_t count, float base) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = base + 0.25f * i;
  return v;
}

inline std::string TempDir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/momentum_store_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

class MomentumStoreTest : public ::testing::Test {
 protected:
  void Install(MomentumStore& store, MomentumStacks layout,
               bool carry_staged = false) {
    absl::StatusOr<PreparedMomentum> prepared =
        store.Prepare(std::move(layout));
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    const absl::Status installed =
        store.Install(std::move(*prepared), carry_staged);
    ASSERT_TRUE(installed.ok()) << installed;
  }
  void Set(MomentumStore& store, const std::string& matrix, int64_t expert,
           std::vector<float> values) {
    absl::StatusOr<CheckedMomentum> checked =
        store.Check(matrix, expert, std::move(values));
    ASSERT_TRUE(checked.ok()) << checked.status();
    ASSERT_TRUE(store.Write(std::move(*checked)).ok());
  }
  // Stages `values` as the new momentum of every slot of stack `stack`.
  void Stage(MomentumStore& store, int stack, float base,
             int64_t step = kAsOfAny) {
    MomentumStack& s = store.installed().stacks[stack];
    for (size_t slot = 0; slot < s.items.size(); ++slot) {
      const std::vector<float> v = Values(s.floats(), base + slot);
      std::copy(v.begin(), v.end(), s.next_at(static_cast<int>(slot)));
    }
    s.next_has_momentum.assign(s.items.size(), true);
    s.next_as_of.assign(s.items.size(), step);
    s.next_valid = true;
  }

  // Runs the installed version's handover on a one-rank transport, as a
  // worker alone in its plan does before the version's first step.
  void HandOver(MomentumStore& store, int64_t last_committed = -1) {
    auto world = transport::ConnectLoopbackWorld(
        1, static_cast<uint64_t>(store.version()),
        transport::LoopbackOptions());
    ASSERT_TRUE(world.ok()) << world.status();
    absl::StatusOr<std::unique_ptr<kernels::FloatBuffer>> control =
        ops_.Allocate(1024, "control");
    ASSERT_TRUE(control.ok());
    bool transport_ok = false;
    const absl::Status handed =
        store.HandOver(*(*world)[0], control->get(), last_committed,
                       absl::Seconds(10), &transport_ok);
    EXPECT_TRUE(transport_ok);
    ASSERT_TRUE(handed.ok()) << handed;
  }

  kernels::CpuDeviceOps ops_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_MOMENTUM_STORE_TEST_FIXTURE_H_
