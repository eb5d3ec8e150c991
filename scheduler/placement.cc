#include "scheduler/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Relative slack below which a change does not count as an improvement, so
// rounding cannot make the search cycle.
double Slack(double load) { return 1e-9 * load + 1e-15; }

// Per worker class, a lazy min-heap of (load, worker): entries whose load
// is no longer the worker's current load are stale and skipped.
class LeastLoaded {
 public:
  explicit LeastLoaded(const Assignment& a)
      : a_(a), heaps_(a.problem().num_classes()) {
    for (int w = 0; w < a.problem().num_workers(); ++w) Push(w);
  }

  void Push(int w) {
    heaps_[a_.problem().worker_class(w)].push({a_.load(w), w});
  }

  // The least loaded worker of class c with room for `item`, or -1.
  int Find(int c, int item) {
    Heap& heap = heaps_[c];
    std::vector<Entry> skipped;
    int found = -1;
    while (!heap.empty()) {
      const Entry top = heap.top();
      if (top.first != a_.load(top.second)) {
        heap.pop();
        continue;
      }
      if (a_.Fits(top.second, item)) {
        found = top.second;
        break;
      }
      skipped.push_back(top);
      heap.pop();
    }
    for (const Entry& e : skipped) heap.push(e);
    return found;
  }

 private:
  using Entry = std::pair<double, int>;
  using Heap =
      std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  const Assignment& a_;
  std::vector<Heap> heaps_;
};

// Up to this many workers, moves and swaps consider every worker as the
// other side; above it, the least loaded per class (moves) or overall
// (swaps), which keeps an iteration O(workers).
constexpr int kExhaustiveWorkers = 128;

// Move targets: every worker but `exclude` when there are few, else the
// least loaded worker of each class other than `exclude`.
std::vector<int> ClassMinima(const Assignment& a, int exclude) {
  const Problem& p = a.problem();
  if (p.num_workers() <= kExhaustiveWorkers) {
    std::vector<int> all;
    for (int w = 0; w < p.num_workers(); ++w) {
      if (w != exclude) all.push_back(w);
    }
    return all;
  }
  std::vector<int> best(p.num_classes(), -1);
  for (int w = 0; w < p.num_workers(); ++w) {
    if (w == exclude) continue;
    int& b = best[p.worker_class(w)];
    if (b < 0 || a.load(w) < a.load(b)) b = w;
  }
  return best;
}

struct Change {
  int item = -1;
  int target = -1;
  int swap_item = -1;  // >= 0 for a swap: this item goes to the max worker
  double new_max = kInf;
  int64_t bytes = 0;
};

// Whether `c` is preferable to `best` under the search's criterion.
bool Better(const Change& c, const Change& best, bool fewest_bytes) {
  if (best.item < 0) return true;
  if (fewest_bytes && c.bytes != best.bytes) return c.bytes < best.bytes;
  return c.new_max < best.new_max;
}

Change BestMove(const Assignment& a, int top, bool fewest_bytes) {
  const Problem& p = a.problem();
  const double limit = a.load(top) - Slack(a.load(top));
  const std::vector<int> minima = ClassMinima(a, top);
  Change best;
  for (const int id : a.slots_on(top)) {
    const int shape = a.slot(id).shape;
    const int item = a.slot(id).newest;
    const double without = a.LoadWithout(top, item);
    auto consider = [&](int t) {
      if (t < 0 || t == top || !a.Fits(t, item)) return;
      const double with = a.LoadWith(t, item);
      const Change c{item, t, -1, std::max(without, with),
                     p.momentum_bytes(item)};
      if (c.new_max < limit && Better(c, best, fewest_bytes)) best = c;
    };
    for (int t : minima) consider(t);
    for (const int id : a.holder_slots(shape)) consider(a.slot(id).worker);
  }
  return best;
}

Change BestSwap(const Assignment& a, int top, bool fewest_bytes) {
  const Problem& p = a.problem();
  const double top_load = a.load(top);
  const double limit = top_load - Slack(top_load);
  // Partners: all workers when there are few, else the least loaded.
  const int kPartners =
      p.num_workers() <= kExhaustiveWorkers ? p.num_workers() : 8;
  std::vector<int> partners;
  for (int w = 0; w < p.num_workers(); ++w) {
    if (w != top) partners.push_back(w);
  }
  const auto by_load = [&a](int x, int y) {
    return a.load(x) != a.load(y) ? a.load(x) < a.load(y) : x < y;
  };
  if (static_cast<int>(partners.size()) > kPartners) {
    std::partial_sort(partners.begin(), partners.begin() + kPartners,
                      partners.end(), by_load);
    partners.resize(kPartners);
  }
  Change best;
  for (const int id_a : a.slots_on(top)) {
    const int shape_a = a.slot(id_a).shape;
    const int item_a = a.slot(id_a).newest;
    const double top_without = a.LoadWithout(top, item_a);
    for (int t : partners) {
      const double t_with = a.LoadWith(t, item_a);
      for (const int id_b : a.slots_on(t)) {
        if (a.slot(id_b).shape == shape_a) continue;
        const int item_b = a.slot(id_b).newest;
        if (a.free_bytes(top) + p.owned_bytes(item_a) < p.owned_bytes(item_b) ||
            a.free_bytes(t) + p.owned_bytes(item_b) < p.owned_bytes(item_a)) {
          continue;
        }
        // Different shapes: each worker's two changes are independent.
        const double new_top = top_without + a.LoadWith(top, item_b) - top_load;
        const double new_t = t_with + a.LoadWithout(t, item_b) - a.load(t);
        const Change c{item_a, t, item_b, std::max(new_top, new_t),
                       p.momentum_bytes(item_a) + p.momentum_bytes(item_b)};
        if (c.new_max < limit && Better(c, best, fewest_bytes)) best = c;
      }
    }
  }
  return best;
}

}  // namespace

std::vector<int> LptOrder(const Problem& problem) {
  // An item's cost depends only on its shape and its link bytes, and 10^5
  // items have far fewer such pairs: the distinct costs are sorted, largest
  // first, and the items counted into them in item order (a counting sort,
  // the order of sorting (-cost, item) pairs).
  const int n = problem.num_items();
  absl::flat_hash_map<std::pair<int, int64_t>, int> kind_of;
  std::vector<int> item_kind(n);
  std::vector<double> kind_cost;
  for (int i = 0; i < n; ++i) {
    const auto [it, inserted] = kind_of.emplace(
        std::make_pair(problem.shape_of(i), problem.link_bytes(i)),
        static_cast<int>(kind_cost.size()));
    if (inserted) kind_cost.push_back(problem.BestStandalone(i));
    item_kind[i] = it->second;
  }
  std::vector<double> costs = kind_cost;
  std::sort(costs.begin(), costs.end(), std::greater<double>());
  costs.erase(std::unique(costs.begin(), costs.end()), costs.end());
  std::vector<int> rank(kind_cost.size());
  for (size_t k = 0; k < kind_cost.size(); ++k) {
    rank[k] = static_cast<int>(std::lower_bound(costs.begin(), costs.end(),
                                                kind_cost[k],
                                                std::greater<double>()) -
                               costs.begin());
  }
  std::vector<int> start(costs.size() + 1, 0);
  for (int i = 0; i < n; ++i) ++start[rank[item_kind[i]] + 1];
  for (size_t r = 1; r < start.size(); ++r) start[r] += start[r - 1];
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[start[rank[item_kind[i]]]++] = i;
  return order;
}

absl::Status PlaceGreedily(const std::vector<int>& order, Assignment* a) {
  const Problem& p = a->problem();
  LeastLoaded least(*a);
  for (int item : order) {
    if (a->owner(item) >= 0) continue;
    int best = -1;
    double best_finish = kInf;
    auto consider = [&](int w, double finish) {
      if (!a->Fits(w, item)) return;
      if (finish < best_finish || (finish == best_finish && w < best)) {
        best = w;
        best_finish = finish;
      }
    };
    for (int c = 0; c < p.num_classes(); ++c) {
      const int w = least.Find(c, item);
      if (w >= 0) consider(w, a->LoadWith(w, item));
    }
    for (const int id : a->holder_slots(p.shape_of(item))) {
      consider(a->slot(id).worker, a->LoadWithOnSlot(id, item));
    }
    if (best < 0) {
      int roomiest = 0;
      for (int w = 1; w < p.num_workers(); ++w) {
        if (a->free_bytes(w) > a->free_bytes(roomiest)) roomiest = w;
      }
      const ItemRef ref = p.item(item);
      const MatrixSpec& m = p.input().matrices[ref.matrix];
      return FieldError(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("matrix ", Quoted(m.name)),
          absl::StrCat("expert ", ref.expert, " needs ", p.owned_bytes(item),
                       " bytes and no worker has room: worker ",
                       Quoted(p.input().workers[roomiest].id),
                       " has the most free, ", a->free_bytes(roomiest),
                       " bytes (short by ",
                       p.owned_bytes(item) - a->free_bytes(roomiest), ")"));
    }
    a->Assign(item, best);
    least.Push(best);
  }
  return absl::OkStatus();
}

int ImproveByLocalSearch(const SearchLimits& limits, Assignment* a) {
  const Problem& p = a->problem();
  int changes = 0;
  while (changes < limits.max_improvements) {
    const int top = a->MaxWorker();
    if (a->load(top) <= limits.target) break;
    // Within 1e-4 of the mean, moving work cannot lower the maximum by a
    // margin worth the search (only batching changes the total).
    if (a->load(top) <= (1 + 1e-4) * a->total_load() / p.num_workers()) break;
    Change change = BestMove(*a, top, limits.fewest_bytes);
    if (change.item < 0) change = BestSwap(*a, top, limits.fewest_bytes);
    if (change.item < 0) break;
    a->Unassign(change.item);
    if (change.swap_item >= 0) {
      a->Unassign(change.swap_item);
      a->Assign(change.swap_item, top);
    }
    a->Assign(change.item, change.target);
    ++changes;
  }
  return changes;
}

namespace {

// Branch and bound over items in LPT order; workers that are still empty
// and interchangeable (same class and capacity) are tried once.
class ExactSearch {
 public:
  ExactSearch(const std::vector<int>& order, Assignment* a)
      : order_(order), a_(a) {}

  void Run(double incumbent) {
    best_max_ = incumbent;
    Visit(0, 0.0);
  }
  const std::vector<int>& best_owners() const { return best_owners_; }

 private:
  void Visit(size_t depth, double current_max) {
    if (current_max >= best_max_ - Slack(best_max_)) return;
    if (depth == order_.size()) {
      best_max_ = current_max;
      best_owners_.assign(order_.size(), -1);
      for (size_t i = 0; i < order_.size(); ++i) {
        best_owners_[i] = a_->owner(order_[i]);
      }
      return;
    }
    const Problem& p = a_->problem();
    const int item = order_[depth];
    for (int w = 0; w < p.num_workers(); ++w) {
      if (!a_->Fits(w, item) || RedundantEmpty(w)) continue;
      const double with = a_->LoadWith(w, item);
      a_->Assign(item, w);
      Visit(depth + 1, std::max(current_max, with));
      a_->Unassign(item);
    }
  }

  // An empty worker identical to an earlier empty one gives the same
  // subtrees.
  bool RedundantEmpty(int w) const {
    if (!a_->slots_on(w).empty()) return false;
    const Problem& p = a_->problem();
    for (int v = 0; v < w; ++v) {
      if (a_->slots_on(v).empty() && p.worker_class(v) == p.worker_class(w) &&
          p.capacity(v) == p.capacity(w)) {
        return true;
      }
    }
    return false;
  }

  const std::vector<int>& order_;
  Assignment* a_;
  double best_max_ = kInf;
  std::vector<int> best_owners_;
};

}  // namespace

std::vector<int32_t> WholeExpertHolders(const Problem& p) {
  const PlanInput& input = p.input();
  const TrainerShards& shards = input.trainer_shards;
  std::vector<int32_t> holder(p.num_items(), -1);
  if (!shards.known()) return holder;
  std::vector<int32_t> workers(p.num_workers());
  for (int w = 0; w < p.num_workers(); ++w) workers[w] = w;
  const std::vector<int32_t> holder_of_shard = shards.HoldersAmong(workers);
  for (int i = 0; i < p.num_items(); ++i) {
    const ItemRef ref = p.item(i);
    const int32_t s =
        shards.ShardOfExpert(input.matrices[ref.matrix], ref.expert);
    if (s < 0) continue;
    const int32_t h = holder_of_shard[s];
    if (h >= 0 && !input.workers[h].owns_nothing) holder[i] = h;
  }
  return holder;
}

int PinExpertsToHolders(Assignment* a) {
  const std::vector<int32_t> holder = WholeExpertHolders(a->problem());
  int pinned = 0;
  for (size_t i = 0; i < holder.size(); ++i) {
    const int item = static_cast<int>(i);
    if (holder[i] < 0 || a->owner(item) >= 0 || !a->Fits(holder[i], item)) {
      continue;
    }
    a->Assign(item, holder[i]);
    ++pinned;
  }
  return pinned;
}

int LeaveExpertsWithHolders(Assignment* a) {
  const Problem& p = a->problem();
  // Per item: the worker holding it whole (-1: none), and its kind: items
  // of one kind cost the same anywhere.
  const std::vector<int32_t> holder = WholeExpertHolders(p);
  if (std::all_of(holder.begin(), holder.end(),
                  [](int32_t h) { return h < 0; })) {
    return 0;
  }
  std::vector<int32_t> kind(p.num_items());
  absl::flat_hash_map<std::tuple<int, int64_t, int64_t>, int32_t> kinds;
  for (int i = 0; i < p.num_items(); ++i) {
    kind[i] =
        kinds
            .try_emplace({p.shape_of(i), p.owned_bytes(i), p.link_bytes(i)},
                         static_cast<int32_t>(kinds.size()))
            .first->second;
  }
  // What each worker could give away, by (worker, kind): items it owns and
  // does not hold. Entries go stale as items move; checked when taken.
  const auto key = [](int32_t w, int32_t k) {
    return (static_cast<int64_t>(w) << 32) | static_cast<uint32_t>(k);
  };
  absl::flat_hash_map<int64_t, std::vector<int>> foreign;
  for (int i = 0; i < p.num_items(); ++i) {
    if (a->owner(i) != holder[i])
      foreign[key(a->owner(i), kind[i])].push_back(i);
  }
  // Each swap brings one more item home (its partner may come home too),
  // so passes end; a pass can give a holder an item to trade that an
  // earlier item of the same pass found it without.
  int swaps = 0;
  for (int pass_swaps = -1; pass_swaps != 0;) {
    pass_swaps = 0;
    for (int i = 0; i < p.num_items(); ++i) {
      const int32_t h = holder[i];
      const int w = a->owner(i);
      if (h < 0 || h == w) continue;
      auto it = foreign.find(key(h, kind[i]));
      if (it == foreign.end()) continue;
      std::vector<int>& given = it->second;
      int j = -1;
      while (!given.empty() && j < 0) {
        const int x = given.back();
        given.pop_back();
        if (x != i && a->owner(x) == h && holder[x] != h) j = x;
      }
      if (j < 0) continue;
      a->Unassign(i);
      a->Unassign(j);
      a->Assign(i, h);
      a->Assign(j, w);
      ++pass_swaps;
      if (holder[j] != w) foreign[key(w, kind[j])].push_back(j);
    }
    swaps += pass_swaps;
  }
  return swaps;
}

std::vector<int> SpreadOverNodes(const Assignment& a) {
  const Problem& p = a.problem();
  std::vector<int> owners(p.num_items());
  for (int i = 0; i < p.num_items(); ++i) owners[i] = a.owner(i);
  // The nodes numbered densely, in the order of their numbers.
  std::vector<int32_t> numbers = p.input().nodes;
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  if (numbers.size() < 2) return owners;
  const std::vector<int32_t> holder = WholeExpertHolders(p);
  if (std::any_of(holder.begin(), holder.end(),
                  [](int32_t h) { return h >= 0; })) {
    return owners;
  }
  const int workers = p.num_workers();
  const int node_count = static_cast<int>(numbers.size());
  std::vector<int> node_of(workers);
  for (int w = 0; w < workers; ++w) {
    node_of[w] = static_cast<int>(
        std::lower_bound(numbers.begin(), numbers.end(), p.input().nodes[w]) -
        numbers.begin());
  }
  std::vector<int64_t> link(workers, 0);
  for (int i = 0; i < p.num_items(); ++i) {
    if (owners[i] >= 0) link[owners[i]] += p.link_bytes(i);
  }
  // The sets of interchangeable workers, and each one's free indices by
  // node, the lowest last (taken from the back).
  std::map<std::tuple<int, bool, bool>, int> sets;
  std::vector<int> set_of(workers);
  for (int w = 0; w < workers; ++w) {
    set_of[w] =
        sets.try_emplace({p.worker_class(w), p.input().workers[w].colocated,
                          p.capacity(w) < 0},
                         static_cast<int>(sets.size()))
            .first->second;
  }
  std::vector<std::vector<std::vector<int>>> free(
      sets.size(), std::vector<std::vector<int>>(node_count));
  for (int w = workers; w-- > 0;) free[set_of[w]][node_of[w]].push_back(w);
  std::vector<int> order(workers);
  for (int w = 0; w < workers; ++w) order[w] = w;
  std::stable_sort(order.begin(), order.end(),
                   [&link](int x, int y) { return link[x] > link[y]; });
  std::vector<int64_t> node_link(node_count, 0);
  std::vector<int> to(workers);
  for (const int w : order) {
    std::vector<std::vector<int>>& set = free[set_of[w]];
    // The lowest free index of w's set on node n with room for w's items
    // (capacities differ by what each device had free), or -1.
    const auto room_on = [&](int n) {
      for (size_t k = set[n].size(); k-- > 0;) {
        if (p.capacity(set[n][k]) >= a.used_bytes(w)) {
          return static_cast<int>(k);
        }
      }
      return -1;
    };
    int best = -1, best_k = -1;
    for (int n = 0; n < node_count; ++n) {
      if (best >= 0 && node_link[n] >= node_link[best]) continue;
      const int k = room_on(n);
      if (k >= 0) {
        best = n;
        best_k = k;
      }
    }
    // The greedy left no index with room: the owners stay as placed.
    if (best < 0) return owners;
    to[w] = set[best][best_k];
    set[best].erase(set[best].begin() + best_k);
    node_link[best] += link[w];
  }
  for (int& owner : owners) {
    if (owner >= 0) owner = to[owner];
  }
  return owners;
}

bool SolveExactly(int max_items, Assignment* a) {
  const Problem& p = a->problem();
  const int n = p.num_items();
  if (n == 0 || n > max_items ||
      std::pow(static_cast<double>(p.num_workers()), n) > 2e5) {
    return false;
  }
  const std::vector<int> order = LptOrder(p);
  std::vector<int> incumbent(n);
  bool complete = true;
  for (int i = 0; i < n; ++i) {
    incumbent[i] = a->owner(i);
    complete = complete && incumbent[i] >= 0;
  }
  const double incumbent_max = complete ? a->MaxLoad() : kInf;
  for (int i = 0; i < n; ++i) {
    if (a->owner(i) >= 0) a->Unassign(i);
  }
  ExactSearch search(order, a);
  // Anything not strictly better than the incumbent keeps the incumbent.
  search.Run(incumbent_max);
  if (search.best_owners().empty()) {
    for (int i = 0; i < n; ++i) {
      if (incumbent[i] >= 0) a->Assign(i, incumbent[i]);
    }
    return complete;
  }
  for (size_t k = 0; k < order.size(); ++k) {
    a->Assign(order[k], search.best_owners()[k]);
  }
  return true;
}

absl::Status PackByBytes(const std::vector<int>& items, Assignment* a) {
  const Problem& p = a->problem();
  std::vector<int> order = items;
  std::stable_sort(order.begin(), order.end(), [&p](int x, int y) {
    return p.owned_bytes(x) > p.owned_bytes(y);
  });
  for (int item : order) {
    int best = -1;
    for (int w = 0; w < p.num_workers(); ++w) {
      if (a->Fits(w, item) &&
          (best < 0 || a->free_bytes(w) < a->free_bytes(best))) {
        best = w;
      }
    }
    if (best < 0) {
      return FieldError(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("matrix ",
                       Quoted(p.input().matrices[p.item(item).matrix].name)),
          "does not fit in any worker's free memory");
    }
    a->Assign(item, best);
  }
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace muonps
