// ControlPlaneTest's helpers: the job spec, what a plan owns and holds,
// and the check of a complete plan.
#include "tests/control_plane_fixture.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"

namespace muonps {
namespace control_plane_test {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return DeadlineIn(d);
}

absl::Status FromGrpc(const grpc::Status& s) {
  return ::muonps::FromGrpc(s, "");
}

v1::JobSpec TinyMoeSpec() {
  v1::JobSpec spec;
  spec.set_name(kJob);
  spec.set_bucket_bytes(int64_t{4} << 20);
  spec.mutable_muon()->set_lr(0.02);
  spec.mutable_muon()->set_weight_decay(0.01);
  auto add = [&spec](const std::string& name, int64_t rows, int64_t cols,
                     int64_t experts, v1::Layout layout, v1::DType dtype,
                     int layer) {
    v1::Matrix* m = spec.add_matrices();
    m->set_name(name);
    m->set_rows(rows);
    m->set_cols(cols);
    m->set_experts(experts);
    m->set_layout(layout);
    m->set_dtype(dtype);
    m->set_layer(layer);
  };
  for (int l = 0; l < 8; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attn.q", 512, 512, 0, v1::LAYOUT_REPLICATED, v1::DTYPE_BF16, l);
    add(p + "attn.kv", 256, 512, 0, v1::LAYOUT_UNREDUCED, v1::DTYPE_BF16, l);
    add(p + "attn.o", 512, 512, 0, v1::LAYOUT_REPLICATED, v1::DTYPE_BF16, l);
    if (l % 2 == 0) {
      add(p + "mlp.up", 1408, 512, 0, v1::LAYOUT_ROW_SHARDED, v1::DTYPE_BF16,
          l);
      add(p + "mlp.down", 512, 1408, 0, v1::LAYOUT_ROW_SHARDED, v1::DTYPE_FP32,
          l);
    } else {
      add(p + "moe.router", 8, 512, 0, v1::LAYOUT_REPLICATED, v1::DTYPE_FP32,
          l);
      add(p + "moe.up", 512, 256, 8, v1::LAYOUT_UNREDUCED, v1::DTYPE_BF16, l);
      add(p + "moe.down", 256, 512, 8, v1::LAYOUT_UNREDUCED, v1::DTYPE_FP16, l);
    }
  }
  return spec;
}

std::map<std::string, Item> ItemsOf(const v1::Plan& plan) {
  std::map<std::string, Item> items;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    for (int e = 0; e < m.owners_size(); ++e) {
      const std::string key =
          m.owners_size() > 1 ? absl::StrCat(m.name(), "[", e, "]") : m.name();
      items[key] = {m.owners(e), m.rows() * m.cols() * 4};
    }
  }
  return items;
}

std::set<std::string> WorkersOf(const v1::Plan& plan) {
  return {plan.workers().begin(), plan.workers().end()};
}

int64_t MomentumOf(const v1::Plan& plan, const std::string& worker_id) {
  for (const v1::WorkerLoad& load : plan.loads()) {
    if (load.worker_id() == worker_id) return load.momentum_bytes();
  }
  return -1;
}

bool ExitedZero(const absl::StatusOr<int>& wait_status) {
  return wait_status.ok() && WIFEXITED(*wait_status) &&
         WEXITSTATUS(*wait_status) == 0;
}

void ExpectCompletePlan(const v1::Plan& plan,
                        const std::set<std::string>& workers) {
  const v1::JobSpec spec = TinyMoeSpec();
  EXPECT_EQ(plan.name(),
            absl::StrCat("jobs/", kJob, "/plans/", plan.version()));
  EXPECT_EQ(WorkersOf(plan), workers);
  EXPECT_EQ(plan.workers_size(), static_cast<int>(workers.size()));
  ASSERT_EQ(plan.matrices_size(), spec.matrices_size());
  int64_t total_bytes = 0;
  for (int i = 0; i < spec.matrices_size(); ++i) {
    const v1::Matrix& want = spec.matrices(i);
    const v1::MatrixPlacement& got = plan.matrices(i);
    EXPECT_EQ(got.name(), want.name());
    EXPECT_EQ(got.owners_size(), std::max<int64_t>(1, want.experts()));
    for (const std::string& owner : got.owners()) {
      EXPECT_EQ(workers.count(owner), 1u)
          << got.name() << " owned by " << owner;
    }
    ASSERT_GE(got.bucket(), 0);
    ASSERT_LT(got.bucket(), plan.buckets_size());
    const auto& in_bucket = plan.buckets(got.bucket()).matrices();
    EXPECT_NE(std::find(in_bucket.begin(), in_bucket.end(), got.name()),
              in_bucket.end())
        << got.name() << " is not in its bucket " << got.bucket();
    total_bytes += got.owners_size() * want.rows() * want.cols() * 4;
  }
  std::multiset<std::string> bucketed;
  for (const v1::Bucket& b : plan.buckets()) {
    bucketed.insert(b.matrices().begin(), b.matrices().end());
    EXPECT_GT(b.bytes(), 0);
  }
  std::multiset<std::string> names;
  for (const v1::Matrix& m : spec.matrices()) names.insert(m.name());
  EXPECT_EQ(bucketed, names);

  const std::map<std::string, Item> items = ItemsOf(plan);
  size_t batched = 0;
  for (const v1::Batch& batch : plan.batches()) {
    for (const std::string& member : batch.matrices()) {
      ++batched;
      ASSERT_EQ(items.count(member), 1u) << member;
      EXPECT_EQ(items.at(member).owner, batch.worker_id()) << member;
    }
  }
  EXPECT_EQ(batched, items.size());

  ASSERT_EQ(plan.loads_size(), static_cast<int>(workers.size()));
  int64_t load_bytes = 0;
  for (const v1::WorkerLoad& load : plan.loads()) {
    EXPECT_EQ(workers.count(load.worker_id()), 1u);
    int64_t owned = 0;
    for (const auto& [name, item] : items) {
      if (item.owner == load.worker_id()) owned += item.momentum_bytes;
    }
    EXPECT_EQ(load.momentum_bytes(), owned) << load.worker_id();
    EXPECT_GE(load.memory_bytes(), load.momentum_bytes());
    EXPECT_LE(load.memory_bytes(), kWorkerMemoryBytes);
    load_bytes += load.momentum_bytes();
  }
  EXPECT_EQ(load_bytes, total_bytes);
  EXPECT_GE(plan.imbalance(), 1.0);
  EXPECT_GT(plan.lower_bound(), 0.0);
  EXPECT_GE(plan.max_seconds(), plan.lower_bound() * (1 - 1e-9));
  EXPECT_GE(plan.max_seconds(), plan.mean_seconds());
}

}  // namespace control_plane_test
}  // namespace muonps
