// JobCatalog: the coordinator's jobs and their specs: creating them (a
// retried CreateJob with the same request id answers the first one's job),
// reading and listing them, deleting them with the job's own token, and the
// counts for metrics. A job's workers and plans are Membership's and
// PlanPublisher's; deleting a job ends them too and wakes their watchers.
//
// Every change is durable (StoreQueue) before it is acknowledged; a bad
// request never changes state. Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_JOB_CATALOG_H_
#define MUONPS_SERVER_COORDINATOR_JOB_CATALOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/coordinator_options.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/plan_publisher.h"
#include "server/coordinator/store_queue.h"

namespace muonps {
namespace coordinator {

struct CreateJobRequest {
  // Makes a retry of the same create idempotent; empty: none.
  std::string request_id;
  JobSpec job;
};

// A job as GetJob and CreateJob answer it.
struct JobInfo {
  std::string name;
  std::shared_ptr<const JobSpec> spec;  // shared with the job
  std::vector<std::string> workers;     // in join order
  int64_t plan_version = 0;             // the latest
  absl::Time create_time;
  // Only CreateJob's answer carries it (DeleteJob needs it).
  std::string job_token;
};

// A job as ListJobs answers it.
struct JobSummary {
  std::string name;
  int64_t matrices = 0;    // experts counted
  int64_t parameters = 0;  // rows * cols * experts, summed
  int32_t workers = 0;
  int64_t plan_version = 0;
};

struct DeleteJobRequest {
  std::string job;
  std::string job_token;
};

// Counts for metrics.
struct StateCounts {
  int64_t jobs = 0;
  int64_t workers = 0;
  int64_t plan_versions = 0;  // published since the start, over all jobs
};

class JobCatalog {
 public:
  // Every pointer must outlive the catalog.
  JobCatalog(const CoordinatorOptions* options, const Clock* clock,
             JobTable* table, StoreQueue* queue, PlanPublisher* plans);
  JobCatalog(const JobCatalog&) = delete;
  JobCatalog& operator=(const JobCatalog&) = delete;

  // Creates job `request.job.name` with no workers (plan version: the
  // name's floor, 0 for a new name) and a fresh job token, which the answer
  // carries. A retry (same non-empty request_id) answers the existing job,
  // token included, once the original is durable. INVALID_ARGUMENT or
  // RESOURCE_EXHAUSTED naming the field (ValidateCreateJob);
  // ALREADY_EXISTS naming job.name; RESOURCE_EXHAUSTED naming job beyond
  // max_jobs; UNAVAILABLE when the store fails.
  absl::StatusOr<JobInfo> CreateJob(CreateJobRequest request);
  // The job without its token. INVALID_ARGUMENT or NOT_FOUND naming job.
  absl::StatusOr<JobInfo> GetJob(const std::string& job);
  // Every job, by name.
  std::vector<JobSummary> ListJobs();
  // Deletes the job, its workers and plans; its name's plan versions
  // continue above its last. UNAUTHENTICATED naming job_token unless it is
  // the one CreateJob returned; NOT_FOUND naming job; UNAVAILABLE when the
  // store fails.
  absl::Status DeleteJob(const DeleteJobRequest& request);

  StateCounts Counts();

 private:
  const CoordinatorOptions& options_;
  const Clock& clock_;
  JobTable* const table_;
  StoreQueue* const queue_;
  PlanPublisher* const plans_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_JOB_CATALOG_H_
