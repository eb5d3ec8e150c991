#include "server/coordinator/plan_reply_cache.h"

#include "server/coordinator/record_wire.h"

namespace muonps {
namespace coordinator {
namespace {

// Whether `a` and `b` share a control block (one plan).
bool SamePlan(const std::weak_ptr<const PublishedPlan>& a,
              const std::shared_ptr<const PublishedPlan>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

}  // namespace

std::shared_ptr<const v1::Plan> PlanReplyCache::Reply(
    const std::shared_ptr<const PublishedPlan>& plan) {
  const Key key(plan->job, plan->version);
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && SamePlan(it->second.plan, plan)) {
      return it->second.reply;
    }
  }
  auto reply = std::make_shared<const v1::Plan>(PlanToProto(*plan));
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = entries_.insert_or_assign(key, Entry{plan, reply});
  if (inserted) order_.push_back(key);
  // Plans their job no longer keeps are asked for no more, and a job's
  // workers move on to its newest.
  std::deque<Key> kept;
  for (const Key& k : order_) {
    auto e = entries_.find(k);
    const bool older = k.first == key.first && k.second < key.second;
    if (older || e->second.plan.expired()) {
      entries_.erase(e);
    } else {
      kept.push_back(k);
    }
  }
  order_.swap(kept);
  while (order_.size() > capacity_) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  return reply;
}

}  // namespace coordinator
}  // namespace muonps
