#include "scheduler/plan_test_util.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/cost_model.h"

namespace muonps {
namespace scheduler {
namespace plan_test {
namespace {

// NS runs on the wide side, so r x c and c x r are one shape (cost_table.h).
using ShapeKey = std::pair<int64_t, int64_t>;
ShapeKey KeyOf(int64_t rows, int64_t cols) {
  return {std::min(rows, cols), std::max(rows, cols)};
}
ShapeKey KeyOf(const MatrixSpec& m) { return KeyOf(m.rows, m.cols); }

// Replicated gradients only send the update out; other layouts also bring
// the gradient in.
int64_t LinkBytes(const MatrixSpec& m) {
  return m.layout == Layout::kReplicated ? PayloadBytes(m)
                                         : 2 * PayloadBytes(m);
}

std::vector<CostModel> ModelsOf(const PlanInput& input) {
  std::vector<CostModel> models;
  for (const WorkerSpec& w : input.workers) {
    models.emplace_back(w.costs, w.rates, w.speed, input.options.ns_steps);
  }
  return models;
}

using Owners = std::vector<ItemOwners>;

// Each worker's seconds under `owners`, straight from CostModel: one batch
// per (worker, shape) plus every item's transfer.
std::vector<double> SecondsOf(const PlanInput& input, const Owners& owners) {
  const std::vector<CostModel> models = ModelsOf(input);
  std::vector<std::map<ShapeKey, int64_t>> counts(input.workers.size());
  std::vector<double> seconds(input.workers.size(), 0.0);
  for (size_t m = 0; m < input.matrices.size(); ++m) {
    const MatrixSpec& spec = input.matrices[m];
    for (const int32_t w : owners[m]) {
      ++counts[w][KeyOf(spec)];
      seconds[w] +=
          models[w].TransferSeconds(static_cast<double>(LinkBytes(spec)));
    }
  }
  for (size_t w = 0; w < counts.size(); ++w) {
    for (const auto& [key, n] : counts[w]) {
      seconds[w] += BatchSplitter(models[w], key.first, key.second,
                                  input.options.algorithm)
                        .Seconds(n);
    }
  }
  return seconds;
}

int64_t RandomDim(std::mt19937& rng) {
  constexpr int64_t kDims[] = {1, 3, 64, 128, 512, 1000, 1024, 2048, 4096};
  return Chance(rng, 0.6) ? kDims[Uniform(rng, 0, 8)] : Uniform(rng, 1, 4096);
}

// Measurements of concave batch curves (base * batch^alpha, alpha <= 1),
// as GPUs give: a batch never costs more than its parts run separately,
// which the planner's lower bound relies on.
std::shared_ptr<const CostTable> RandomTable(
    std::mt19937& rng, const std::vector<MatrixSpec>& matrices) {
  auto table = std::make_shared<CostTable>();
  std::set<ShapeKey> done;
  for (const MatrixSpec& m : matrices) {
    if (!done.insert(KeyOf(m)).second || Chance(rng, 0.3)) continue;
    for (const NsAlgorithm algorithm :
         {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      if (Chance(rng, 0.3)) continue;
      const double base = UniformReal(rng, 1e-4, 2e-2);
      const double alpha = UniformReal(rng, 0.3, 1.0);
      for (const int64_t batch : {1, 2, 3, 4, 8, 16}) {
        if (Chance(rng, 0.5)) continue;
        const absl::Status added =
            table->Add(m.rows, m.cols, algorithm, batch,
                       base * std::pow(static_cast<double>(batch), alpha));
        EXPECT_TRUE(added.ok()) << added;
      }
    }
  }
  return table;
}

}  // namespace

int64_t MomentumBytes(const MatrixSpec& m) { return 4 * m.rows * m.cols; }

void ExpectValidPlan(const PlanInput& input, const OwnershipPlan& plan) {
  const int workers = static_cast<int>(input.workers.size());
  const int matrices = static_cast<int>(input.matrices.size());
  ASSERT_EQ(plan.matrix_names.size(), input.matrices.size());
  ASSERT_EQ(plan.worker_ids.size(), input.workers.size());
  ASSERT_EQ(plan.owners.size(), input.matrices.size());
  std::vector<std::vector<int>> seen(matrices);
  for (int m = 0; m < matrices; ++m) {
    EXPECT_EQ(plan.matrix_names[m], input.matrices[m].name);
    ASSERT_EQ(static_cast<int64_t>(plan.owners[m].size()),
              input.matrices[m].experts);
    for (const int32_t w : plan.owners[m]) {
      ASSERT_GE(w, 0) << input.matrices[m].name;
      ASSERT_LT(w, workers) << input.matrices[m].name;
    }
    seen[m].assign(plan.owners[m].size(), 0);
  }
  for (int w = 0; w < workers; ++w) {
    EXPECT_EQ(plan.worker_ids[w], input.workers[w].id);
  }
  const std::vector<CostModel> models = ModelsOf(input);
  std::set<std::pair<int32_t, ShapeKey>> batch_keys;
  int32_t previous_worker = 0;
  for (const Batch& b : plan.batches) {
    ASSERT_GE(b.worker, 0);
    ASSERT_LT(b.worker, workers);
    EXPECT_GE(b.worker, previous_worker) << "batches not sorted by worker";
    previous_worker = b.worker;
    ASSERT_FALSE(b.items.empty());
    EXPECT_TRUE(batch_keys.insert({b.worker, KeyOf(b.rows, b.cols)}).second)
        << "two batches of " << b.rows << " x " << b.cols << " on worker "
        << b.worker;
    EXPECT_TRUE(std::is_sorted(b.items.begin(), b.items.end(),
                               [](const ItemRef& x, const ItemRef& y) {
                                 return std::make_pair(x.matrix, x.expert) <
                                        std::make_pair(y.matrix, y.expert);
                               }));
    for (const ItemRef& item : b.items) {
      ASSERT_GE(item.matrix, 0);
      ASSERT_LT(item.matrix, matrices);
      const MatrixSpec& spec = input.matrices[item.matrix];
      ASSERT_GE(item.expert, 0);
      ASSERT_LT(item.expert, spec.experts);
      EXPECT_EQ(KeyOf(spec), KeyOf(b.rows, b.cols)) << spec.name;
      EXPECT_EQ(plan.owners[item.matrix][item.expert], b.worker) << spec.name;
      ++seen[item.matrix][item.expert];
    }
    BatchSplitter splitter(models[b.worker], b.rows, b.cols,
                           input.options.algorithm);
    const int64_t n = static_cast<int64_t>(b.items.size());
    const BatchParts best = splitter.Parts(n);
    ASSERT_EQ(b.parts.size(), best.size());
    int64_t counted = 0;
    for (size_t p = 0; p < best.size(); ++p) {
      EXPECT_EQ(b.parts[p].count, best[p].count);
      EXPECT_EQ(b.parts[p].algorithm, best[p].algorithm);
      EXPECT_NEAR(b.parts[p].seconds, best[p].seconds, kRel * best[p].seconds);
      counted += b.parts[p].count;
    }
    EXPECT_EQ(counted, n);
    EXPECT_NEAR(b.seconds, splitter.Seconds(n), kRel * b.seconds);
  }
  for (int m = 0; m < matrices; ++m) {
    for (size_t e = 0; e < seen[m].size(); ++e) {
      EXPECT_EQ(seen[m][e], 1) << input.matrices[m].name << " expert " << e
                               << " is in this many batches";
    }
  }
  std::vector<int64_t> memory(workers, 0), momentum(workers, 0),
      link(workers, 0);
  for (int m = 0; m < matrices; ++m) {
    const MatrixSpec& spec = input.matrices[m];
    for (const int32_t w : plan.owners[m]) {
      memory[w] += OwnedBytes(spec);
      momentum[w] += MomentumBytes(spec);
      link[w] += LinkBytes(spec);
    }
  }
  EXPECT_EQ(plan.worker_memory_bytes, memory);
  EXPECT_EQ(plan.worker_momentum_bytes, momentum);
  EXPECT_EQ(plan.worker_link_bytes, link);
  for (int w = 0; w < workers; ++w) {
    EXPECT_LE(memory[w],
              input.workers[w].memory_bytes - input.options.workspace_bytes)
        << "worker " << input.workers[w].id << " over its memory";
  }
  const std::vector<double> seconds = SecondsOf(input, plan.owners);
  ASSERT_EQ(plan.worker_seconds.size(), seconds.size());
  double sum = 0;
  for (int w = 0; w < workers; ++w) {
    EXPECT_NEAR(plan.worker_seconds[w], seconds[w], kRel * seconds[w])
        << "worker " << input.workers[w].id;
    sum += plan.worker_seconds[w];
  }
  EXPECT_EQ(plan.max_seconds, *std::max_element(plan.worker_seconds.begin(),
                                                plan.worker_seconds.end()));
  EXPECT_NEAR(plan.mean_seconds, sum / workers, kRel * plan.mean_seconds);
  ASSERT_GT(plan.mean_seconds, 0);
  EXPECT_NEAR(plan.imbalance, plan.max_seconds / plan.mean_seconds,
              kRel * plan.imbalance);
  EXPECT_GT(plan.lower_bound, 0);
  // The bound and a one-matrix worker's load add the same terms in another
  // order: allow rounding only.
  EXPECT_LE(plan.lower_bound, plan.max_seconds * (1 + 1e-12));
}

int64_t Uniform(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
double UniformReal(std::mt19937& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}
bool Chance(std::mt19937& rng, double p) { return UniformReal(rng, 0, 1) < p; }

PlanInput RandomInput(uint32_t seed, const InstanceLimits& limits) {
  std::mt19937 rng(seed);
  PlanInput input;
  input.options.ns_steps =
      Chance(rng, 0.7) ? 5 : static_cast<int>(Uniform(rng, 1, 8));
  input.options.algorithm = static_cast<AlgorithmPolicy>(Uniform(rng, 0, 2));
  input.options.workspace_bytes = Uniform(rng, 0, 4 * kGiB);
  std::vector<ShapeKey> pool(Uniform(rng, 1, limits.max_distinct_shapes));
  for (ShapeKey& s : pool) s = {RandomDim(rng), RandomDim(rng)};
  const int matrices = static_cast<int>(Uniform(rng, 1, limits.max_matrices));
  for (int i = 0; i < matrices; ++i) {
    MatrixSpec m;
    m.name = absl::StrCat("layers.", i / 4, ".m", i);
    if (Chance(rng, 0.75)) {
      const ShapeKey s = pool[Uniform(rng, 0, pool.size() - 1)];
      const bool transpose = Chance(rng, 0.3);
      m.rows = transpose ? s.second : s.first;
      m.cols = transpose ? s.first : s.second;
    } else {
      m.rows = RandomDim(rng);
      m.cols = RandomDim(rng);
    }
    m.experts = Chance(rng, 0.2) ? Uniform(rng, 1, limits.max_experts) : 1;
    constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16,
                                 DType::kFloat16};
    m.dtype = kDTypes[Uniform(rng, 0, 2)];
    m.layout = static_cast<Layout>(Uniform(rng, 0, 2));
    m.layer = static_cast<int32_t>(Uniform(rng, 0, 9));
    input.matrices.push_back(m);
  }
  const std::shared_ptr<const CostTable> tables[] = {
      Chance(rng, 0.5) ? RandomTable(rng, input.matrices) : nullptr,
      Chance(rng, 0.3) ? RandomTable(rng, input.matrices) : nullptr, nullptr};
  const bool heterogeneous = Chance(rng, 0.5);
  const int workers = static_cast<int>(Uniform(rng, 1, limits.max_workers));
  for (int i = 0; i < workers; ++i) {
    WorkerSpec w;
    w.id = absl::StrCat("w", i);
    w.costs = tables[Uniform(rng, 0, 2)];
    if (heterogeneous) w.speed = UniformReal(rng, 0.25, 4.0);
    if (Chance(rng, 0.15)) {
      w.rates.link_bytes_per_second = 25e9;
      w.rates.call_overhead_seconds = 200e-6;
    }
    input.workers.push_back(w);
  }
  int64_t total = 0;
  int64_t largest = 0;
  for (const MatrixSpec& m : input.matrices) {
    total += m.experts * OwnedBytes(m);
    largest = std::max(largest, OwnedBytes(m));
  }
  const bool tight = limits.tight_memory_allowed && Chance(rng, 0.4);
  for (WorkerSpec& w : input.workers) {
    // Tight: the matrices fill up to 70% of all memory, and each is at most
    // a quarter of any worker's, so a placement always exists (every worker
    // over 75% full would hold more than there is) and memory binds.
    const double share = static_cast<double>(total) / (0.7 * workers);
    const int64_t capacity =
        tight
            ? std::max(4 * largest,
                       static_cast<int64_t>(share * UniformReal(rng, 1.0, 1.5)))
            : int64_t{1} << 42;
    w.memory_bytes = input.options.workspace_bytes + capacity;
  }
  return input;
}

Optimum BruteForce(const PlanInput& input) {
  const int n = static_cast<int>(input.matrices.size());
  const int workers = static_cast<int>(input.workers.size());
  std::map<ShapeKey, int> shape_ids;
  std::vector<int> shape(n);
  for (int i = 0; i < n; ++i) {
    shape[i] = shape_ids.emplace(KeyOf(input.matrices[i]), shape_ids.size())
                   .first->second;
  }
  const int shapes = static_cast<int>(shape_ids.size());
  // batch[w][s][k]: k items of shape s batched on worker w.
  const std::vector<CostModel> models = ModelsOf(input);
  std::vector<std::vector<std::vector<double>>> batch(
      workers, std::vector<std::vector<double>>(shapes));
  std::vector<std::vector<double>> transfer(workers, std::vector<double>(n));
  for (int w = 0; w < workers; ++w) {
    for (const auto& [key, s] : shape_ids) {
      BatchSplitter splitter(models[w], key.first, key.second,
                             input.options.algorithm);
      for (int k = 0; k <= n; ++k) batch[w][s].push_back(splitter.Seconds(k));
    }
    for (int i = 0; i < n; ++i) {
      transfer[w][i] = models[w].TransferSeconds(
          static_cast<double>(LinkBytes(input.matrices[i])));
    }
  }
  int64_t assignments = 1;
  for (int i = 0; i < n; ++i) assignments *= workers;
  Optimum best;
  std::vector<int> count(workers * shapes);
  std::vector<int64_t> used(workers);
  std::vector<double> load(workers);
  for (int64_t code = 0; code < assignments; ++code) {
    std::fill(count.begin(), count.end(), 0);
    std::fill(used.begin(), used.end(), 0);
    std::fill(load.begin(), load.end(), 0.0);
    int64_t rest = code;
    for (int i = 0; i < n; ++i, rest /= workers) {
      const int w = static_cast<int>(rest % workers);
      ++count[w * shapes + shape[i]];
      used[w] += OwnedBytes(input.matrices[i]);
      load[w] += transfer[w][i];
    }
    bool fits = true;
    double max = 0;
    for (int w = 0; w < workers; ++w) {
      fits = fits && used[w] <= input.workers[w].memory_bytes -
                                    input.options.workspace_bytes;
      for (int s = 0; s < shapes; ++s)
        load[w] += batch[w][s][count[w * shapes + s]];
      max = std::max(max, load[w]);
    }
    if (fits && max < best.max_seconds) {
      best.feasible = true;
      best.max_seconds = max;
    }
  }
  return best;
}

WorkerSpec Worker(const std::string& id, int64_t memory_bytes, double speed,
                  std::shared_ptr<const CostTable> costs) {
  WorkerSpec w;
  w.id = id;
  w.memory_bytes = memory_bytes;
  w.speed = speed;
  w.costs = std::move(costs);
  return w;
}

int CountOn(const OwnershipPlan& plan, int32_t worker) {
  int n = 0;
  for (const auto& experts : plan.owners) {
    n += static_cast<int>(std::count(experts.begin(), experts.end(), worker));
  }
  return n;
}

}  // namespace plan_test
}  // namespace scheduler
}  // namespace muonps
