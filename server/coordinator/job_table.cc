#include "server/coordinator/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/coordinator/request_validation.h"

namespace muonps {
namespace coordinator {

absl::StatusOr<JobRecord*> JobTable::Find(const std::string& name) {
  MUONPS_RETURN_IF_ERROR(ValidateId(name, "job"));
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return FieldError(absl::StatusCode::kNotFound, "job",
                      absl::StrCat(Quoted(name), " does not exist"));
  }
  return &it->second;
}

JobRecord* JobTable::FindIncarnation(const std::string& name,
                                     uint64_t incarnation) {
  auto it = jobs_.find(name);
  return it == jobs_.end() || it->second.incarnation != incarnation
             ? nullptr
             : &it->second;
}

JobRecord& JobTable::Insert(const std::string& name, JobRecord record) {
  JobRecord& job = jobs_[name];
  job = std::move(record);
  job.incarnation = next_incarnation_++;
  auto floor = version_floors_.find(name);
  if (floor != version_floors_.end()) job.plans.ContinueAfter(floor->second);
  return job;
}

int64_t JobTable::Remove(const std::string& name, JobRecord* removed) {
  auto it = jobs_.find(name);
  int64_t& floor = version_floors_[name];
  floor = std::max(floor, it->second.plans.latest_version());
  *removed = std::move(it->second);
  jobs_.erase(it);
  return floor;
}

}  // namespace coordinator
}  // namespace muonps
