// JobStore: the coordinator's durable state (muonps-coordinator
// --state_dir): jobs with their spec and credentials, members with their
// join requests and worker tokens, each job's latest plan with its NCCL id,
// and the plan-version floor of deleted job names, so that versions never
// go backwards across restarts or a job deleted and created again. Leases
// are not stored: a restarted coordinator gives every member a fresh one.
//
// Why SQLite (Debian's libsqlite3): one file, transactions that are atomic
// and durable across kill -9 and power loss (write-ahead log with
// synchronous=FULL: every commit is fsynced before Apply returns), an
// integrity check, and a command-line shell (`sqlite3 coordinator.db`)
// operators can inspect it with. LMDB would do as well but needs its map
// size chosen up front; LevelDB and RocksDB are key-value stores whose
// write batches we would have to build ourselves, and RocksDB is a large
// dependency for a few kilobytes of state.
//
// The directory holds `coordinator.db` (and SQLite's -wal/-shm files) and a
// `LOCK` file: Open takes an exclusive flock on LOCK for the store's
// lifetime, so a second coordinator on the same directory fails to open it
// (the kernel drops the lock when the process dies, kill -9 included).
// Tokens and the data-plane secret are stored as they are handed out (a
// retried CreateJob or JoinJob returns them again), so the directory and
// files are created 0700 / 0600.
//
// The API is the coordinator's own types (job_spec.h, worker_types.h,
// published_plan.h); on disk a spec, a join request and a plan are their
// muonps.v1 messages, serialized: this store converts them at its own edge,
// with the service's conversions (coordinator_wire.h), so the files read as
// the API does and an older build's rows still load.
//
// Thread-compatible: the caller serializes Load and Apply (the coordinator
// does, with one writer at a time).
#ifndef MUONPS_SERVER_COORDINATOR_JOB_STORE_H_
#define MUONPS_SERVER_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/published_plan.h"
#include "server/coordinator/worker_types.h"

struct sqlite3;

namespace muonps {
namespace coordinator {

// A member of a job as stored: what it joined with and the token it got.
struct StoredWorker {
  std::string worker_id;
  JoinRequest join;
  int64_t join_time_ms = 0;  // Unix milliseconds
  std::string token;
  // Orders members as they joined (plans rank workers in join order).
  int64_t join_seq = 0;
  // Leaving (LeaveJob with drain): plans give it nothing.
  bool draining = false;
};

// A job's latest plan and the NCCL id rank 0 put for it (empty: none yet).
struct StoredPlan {
  int64_t version = 0;
  // The plan, or why it does not fit its job's matrices (Load reads it back
  // against them; the coordinator then drops it and says so).
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> plan;
  std::string nccl_id;
  int64_t nccl_generation = 0;
};

struct StoredJob {
  std::string name;
  std::shared_ptr<const JobSpec> spec;  // shared: specs are megabytes
  std::string create_request_id;
  int64_t create_time_ms = 0;  // Unix milliseconds
  std::string job_token;
  std::string data_plane_secret;
  std::vector<StoredWorker> workers;  // in join_seq order
  std::optional<StoredPlan> plan;
};

// Everything Load returns; the caller owns it.
struct StoredState {
  std::vector<StoredJob> jobs;  // by name
  // The last plan version of every job name ever deleted (and not created
  // again since with a higher one): a job of that name continues above it.
  std::map<std::string, int64_t> version_floors;
};

// One change; Apply writes a list of them in one transaction.
namespace store_op {
struct PutJob {
  StoredJob job;  // workers and plan are ignored: see PutWorker, PutPlan
};
// Deletes the job, its members and its plan; records `last_version` as the
// name's version floor.
struct DeleteJob {
  std::string job;
  int64_t last_version = 0;
};
struct PutWorker {
  std::string job;
  StoredWorker worker;
};
struct DeleteWorker {
  std::string job;
  std::string worker_id;
};
// Replaces the job's plan (NCCL id included). Shared, not copied: plans of
// big jobs are megabytes.
struct PutPlan {
  std::string job;
  std::shared_ptr<const PublishedPlan> plan;
  std::string nccl_id;
  int64_t nccl_generation = 0;
};
// Sets the NCCL id of the job's stored plan, which must be `plan_version`.
struct PutNcclId {
  std::string job;
  int64_t plan_version = 0;
  std::string nccl_id;
  int64_t nccl_generation = 0;
};
}  // namespace store_op

using StoreOp = std::variant<store_op::PutJob, store_op::DeleteJob,
                             store_op::PutWorker, store_op::DeleteWorker,
                             store_op::PutPlan, store_op::PutNcclId>;

class JobStore {
 public:
  // Opens (creating if needed, mode 0700) directory `dir` and the database
  // in it, and locks it for this process. FAILED_PRECONDITION naming
  // state_dir and `dir` when another process (or another JobStore) holds the
  // lock, with the holder's pid from the LOCK file, and when the database
  // has a schema version this build does not read; DATA_LOSS when it fails
  // SQLite's integrity check; INTERNAL naming the file and the error
  // otherwise. The caller owns the store.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& dir);

  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;
  // Closes the database and releases the lock.
  ~JobStore();

  const std::string& dir() const { return dir_; }

  // Reads the whole state. DATA_LOSS naming the row when a stored message
  // does not parse or a stored spec holds a value outside an enum.
  absl::StatusOr<StoredState> Load();

  // Applies `ops` in order in one transaction, durable (fsynced) when it
  // returns OK; on failure nothing of them is applied. INTERNAL naming the
  // database and SQLite's message on an I/O or SQL error.
  absl::Status Apply(const std::vector<StoreOp>& ops);

 private:
  JobStore(std::string dir, int lock_fd, sqlite3* db)
      : dir_(std::move(dir)), lock_fd_(lock_fd), db_(db) {}

  absl::Status Exec(const char* sql);
  absl::Status ApplyOne(const StoreOp& op);
  absl::Status Error(const std::string& what) const;

  const std::string dir_;
  int lock_fd_;
  sqlite3* db_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_JOB_STORE_H_
