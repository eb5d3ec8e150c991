// PlanReplyCache: each published plan converted into its muonps.v1.Plan
// once, for every GetPlan and WatchPlan of it. Plans of big jobs are
// megabytes and every worker of a job reads each version, so the service
// edge converts a version once and shares the message. Holds at most
// `capacity` conversions, of plans their job still keeps, and of each job
// only the newest asked for (its workers follow the newest; an older one
// asked again is converted again). Keyed by job and version and checked
// against the plan itself: a job deleted and created again reuses versions.
//
// Thread-safe; conversions run outside its mutex.
#ifndef MUONPS_SERVER_COORDINATOR_PLAN_REPLY_CACHE_H_
#define MUONPS_SERVER_COORDINATOR_PLAN_REPLY_CACHE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "muonps/v1/plan.pb.h"
#include "server/coordinator/published_plan.h"

namespace muonps {
namespace coordinator {

class PlanReplyCache {
 public:
  explicit PlanReplyCache(size_t capacity = 32) : capacity_(capacity) {}
  PlanReplyCache(const PlanReplyCache&) = delete;
  PlanReplyCache& operator=(const PlanReplyCache&) = delete;

  // `plan` as a message (PlanToProto), converted on its first request.
  std::shared_ptr<const v1::Plan> Reply(
      const std::shared_ptr<const PublishedPlan>& plan)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::pair<std::string, int64_t>;
  struct Entry {
    std::weak_ptr<const PublishedPlan> plan;  // the job keeps it alive
    std::shared_ptr<const v1::Plan> reply;
  };

  const size_t capacity_;
  absl::Mutex mu_;
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_PLAN_REPLY_CACHE_H_
