#include "server/coordinator/job_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"
#include "server/coordinator/record_wire.h"

namespace muonps {
namespace coordinator {
namespace {

// 2 added workers.draining and workers.certificate; a version-1 store is
// migrated on Open.
constexpr int64_t kSchemaVersion = 2;

constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS meta("
    " key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS jobs("
    " name TEXT PRIMARY KEY, spec BLOB NOT NULL,"
    " create_request_id TEXT NOT NULL, create_time_ms INTEGER NOT NULL,"
    " job_token TEXT NOT NULL, data_plane_secret TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS workers("
    " job TEXT NOT NULL, worker_id TEXT NOT NULL, join_request BLOB NOT NULL,"
    " join_time_ms INTEGER NOT NULL, token TEXT NOT NULL,"
    " join_seq INTEGER NOT NULL, draining INTEGER NOT NULL DEFAULT 0,"
    " certificate TEXT NOT NULL DEFAULT '', PRIMARY KEY (job, worker_id))",
    "CREATE TABLE IF NOT EXISTS plans("
    " job TEXT PRIMARY KEY, version INTEGER NOT NULL, plan BLOB NOT NULL,"
    " nccl_id BLOB NOT NULL, nccl_generation INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS version_floors("
    " job TEXT PRIMARY KEY, version INTEGER NOT NULL)",
};

// A prepared statement, finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool prepared() const { return rc_ == SQLITE_OK; }
  Statement& Int(int i, int64_t v) {
    Keep(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  Statement& Text(int i, const std::string& v) {
    Keep(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                           SQLITE_TRANSIENT));
    return *this;
  }
  Statement& Blob(int i, const std::string& v) {
    // A zero-length blob, not NULL, for an empty value.
    Keep(sqlite3_bind_blob(stmt_, i, v.empty() ? "" : v.data(),
                           static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE, or an error code (also a failed bind's).
  int Step() {
    if (rc_ != SQLITE_OK) return rc_;
    return sqlite3_step(stmt_);
  }
  int64_t ColumnInt(int c) { return sqlite3_column_int64(stmt_, c); }
  std::string ColumnBytes(int c) {
    const void* p = sqlite3_column_blob(stmt_, c);
    const int n = sqlite3_column_bytes(stmt_, c);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p), n);
  }

 private:
  void Keep(int rc) {
    if (rc_ == SQLITE_OK) rc_ = rc;
  }
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", Quoted(path), ": ", std::strerror(errno));
}

// Takes the directory's LOCK: its fd, or FAILED_PRECONDITION naming `dir`
// and the holder's pid.
absl::StatusOr<int> LockDirectory(const std::string& dir) {
  const std::string path = dir + "/LOCK";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(Errno("cannot open", path));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char buffer[32] = {};
    const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
    close(fd);
    if (error != EWOULDBLOCK) {
      errno = error;
      return absl::InternalError(Errno("cannot lock", path));
    }
    const std::string holder(absl::StripAsciiWhitespace(
        std::string(buffer, n > 0 ? static_cast<size_t>(n) : 0)));
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "state_dir",
        absl::StrCat(Quoted(dir), " is locked by another muonps-coordinator",
                     holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"),
                     ": two coordinators on one state directory would "
                     "overwrite each other's jobs"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                   static_cast<ssize_t>(pid.size())) {
    close(fd);
    return absl::InternalError(Errno("cannot write", path));
  }
  return fd;
}

template <typename Message>
absl::Status ParseRow(Message* out, const std::string& bytes,
                      const std::string& what) {
  if (!out->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(
        "state store: ", what, " does not parse as ", out->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& dir) {
  if (dir.empty()) return InvalidField("state_dir", "is empty");
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(Errno("cannot create", dir));
  }
  MUONPS_ASSIGN_OR_RETURN(const int lock_fd, LockDirectory(dir));
  const std::string path = dir + "/coordinator.db";
  // Created 0600 before SQLite opens it (its -wal file copies the mode).
  const int db_fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (db_fd < 0) {
    close(lock_fd);
    return absl::InternalError(Errno("cannot open", path));
  }
  close(db_fd);
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  std::unique_ptr<JobStore> store(new JobStore(dir, lock_fd, db));
  if (rc != SQLITE_OK) {
    return absl::InternalError(
        absl::StrCat("cannot open ", Quoted(path), ": ",
                     db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
  }
  // Every commit is fsynced before it returns (WAL with synchronous=FULL).
  MUONPS_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  MUONPS_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  {
    Statement check(db, "PRAGMA quick_check");
    if (check.Step() != SQLITE_ROW) return store->Error("integrity check");
    const std::string verdict = check.ColumnBytes(0);
    if (verdict != "ok") {
      return absl::DataLossError(
          absl::StrCat("state store ", Quoted(path), " is corrupt: ", verdict));
    }
  }
  for (const char* sql : kSchema) MUONPS_RETURN_IF_ERROR(store->Exec(sql));
  int64_t version = 0;  // 0: a new database
  {
    Statement read(db, "SELECT value FROM meta WHERE key = 'schema_version'");
    const int step = read.Step();
    if (step == SQLITE_ROW) {
      version = read.ColumnInt(0);
    } else if (step != SQLITE_DONE) {
      return store->Error("schema version");
    }
  }
  if (version == 0) {
    Statement write(db,
                    "INSERT INTO meta(key, value) VALUES('schema_version', ?)");
    write.Int(1, kSchemaVersion);
    if (write.Step() != SQLITE_DONE) return store->Error("schema version");
  } else if (version == 1) {
    // Version 1 had neither column (the CREATE above kept its table).
    MUONPS_RETURN_IF_ERROR(store->Exec(
        "BEGIN; ALTER TABLE workers ADD COLUMN draining INTEGER NOT NULL "
        "DEFAULT 0; ALTER TABLE workers ADD COLUMN certificate TEXT NOT NULL "
        "DEFAULT ''; UPDATE meta SET value = 2 WHERE key = 'schema_version'; "
        "COMMIT"));
  } else if (version != kSchemaVersion) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "state_dir",
        absl::StrCat(Quoted(dir), " holds schema version ", version,
                     "; this build reads ", kSchemaVersion));
  }
  return store;
}

JobStore::~JobStore() {
  if (db_ != nullptr) sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

absl::Status JobStore::Error(const std::string& what) const {
  return absl::InternalError(
      absl::StrCat("state store ", Quoted(dir_ + "/coordinator.db"), ": ", what,
                   ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::Exec(const char* sql) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &message);
  if (rc != SQLITE_OK) {
    const std::string text = message != nullptr ? message : sqlite3_errstr(rc);
    sqlite3_free(message);
    const int primary = rc & 0xff;
    return absl::Status(
        primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT
            ? absl::StatusCode::kDataLoss
            : absl::StatusCode::kInternal,
        absl::StrCat("state store ", Quoted(dir_ + "/coordinator.db"), ": ",
                     sql, ": ", text));
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredState> JobStore::Load() {
  StoredState out;
  std::map<std::string, size_t> index;
  {
    Statement s(db_,
                "SELECT name, spec, create_request_id, create_time_ms, "
                "job_token, data_plane_secret FROM jobs ORDER BY name");
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      StoredJob job;
      job.name = s.ColumnBytes(0);
      v1::JobSpec spec;
      MUONPS_RETURN_IF_ERROR(ParseRow(&spec, s.ColumnBytes(1),
                                      absl::StrCat("job ", Quoted(job.name))));
      absl::StatusOr<JobSpec> converted = JobSpecFromProto(spec);
      if (!converted.ok()) {
        return absl::DataLossError(absl::StrCat(
            "state store: job ", Quoted(job.name),
            ": stored spec is invalid: ", converted.status().message()));
      }
      job.spec = std::make_shared<const JobSpec>(*std::move(converted));
      job.create_request_id = s.ColumnBytes(2);
      job.create_time_ms = s.ColumnInt(3);
      job.job_token = s.ColumnBytes(4);
      job.data_plane_secret = s.ColumnBytes(5);
      index[job.name] = out.jobs.size();
      out.jobs.push_back(std::move(job));
    }
    if (rc != SQLITE_DONE) return Error("reading jobs");
  }
  {
    Statement s(db_,
                "SELECT job, worker_id, join_request, join_time_ms, token, "
                "join_seq, draining, certificate FROM workers ORDER BY job, "
                "join_seq");
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      const std::string job = s.ColumnBytes(0);
      StoredWorker w;
      w.worker_id = s.ColumnBytes(1);
      v1::JoinJobRequest join;
      MUONPS_RETURN_IF_ERROR(
          ParseRow(&join, s.ColumnBytes(2),
                   absl::StrCat("worker ", Quoted(w.worker_id), " of job ",
                                Quoted(job))));
      w.join = JoinRequestFromProto(join);
      w.join_time_ms = s.ColumnInt(3);
      w.token = s.ColumnBytes(4);
      w.join_seq = s.ColumnInt(5);
      w.draining = s.ColumnInt(6) != 0;
      // Not part of the join's message: the service edge set it.
      w.join.certificate = s.ColumnBytes(7);
      auto it = index.find(job);
      if (it == index.end()) continue;  // an orphan; never written so
      out.jobs[it->second].workers.push_back(std::move(w));
    }
    if (rc != SQLITE_DONE) return Error("reading workers");
  }
  {
    Statement s(db_, "SELECT job, plan, nccl_id, nccl_generation FROM plans");
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      const std::string job = s.ColumnBytes(0);
      v1::Plan proto;
      MUONPS_RETURN_IF_ERROR(ParseRow(
          &proto, s.ColumnBytes(1), absl::StrCat("plan of job ", Quoted(job))));
      auto it = index.find(job);
      if (it == index.end()) continue;
      StoredJob& stored = out.jobs[it->second];
      StoredPlan plan;
      plan.version = proto.version();
      plan.plan = PlanFromProto(
          proto, std::shared_ptr<const std::vector<scheduler::MatrixSpec>>(
                     stored.spec, &stored.spec->matrices));
      plan.nccl_id = s.ColumnBytes(2);
      plan.nccl_generation = s.ColumnInt(3);
      stored.plan = std::move(plan);
    }
    if (rc != SQLITE_DONE) return Error("reading plans");
  }
  {
    Statement s(db_, "SELECT job, version FROM version_floors");
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      out.version_floors[s.ColumnBytes(0)] = s.ColumnInt(1);
    }
    if (rc != SQLITE_DONE) return Error("reading version floors");
  }
  return out;
}

absl::Status JobStore::ApplyOne(const StoreOp& op) {
  // Runs `sql` with the binds `bind` sets; OK when it completes.
  auto run = [this](const char* sql, auto bind) -> absl::Status {
    Statement s(db_, sql);
    bind(s);
    if (s.Step() != SQLITE_DONE) return Error(sql);
    return absl::OkStatus();
  };
  return std::visit(
      [&](const auto& o) -> absl::Status {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, store_op::PutJob>) {
          return run(
              "INSERT OR REPLACE INTO jobs(name, spec, create_request_id, "
              "create_time_ms, job_token, data_plane_secret) "
              "VALUES(?, ?, ?, ?, ?, ?)",
              [&](Statement& s) {
                s.Text(1, o.job.name)
                    .Blob(2, JobSpecToProto(*o.job.spec).SerializeAsString())
                    .Text(3, o.job.create_request_id)
                    .Int(4, o.job.create_time_ms)
                    .Text(5, o.job.job_token)
                    .Text(6, o.job.data_plane_secret);
              });
        } else if constexpr (std::is_same_v<T, store_op::DeleteJob>) {
          for (const char* sql : {"DELETE FROM jobs WHERE name = ?",
                                  "DELETE FROM workers WHERE job = ?",
                                  "DELETE FROM plans WHERE job = ?"}) {
            MUONPS_RETURN_IF_ERROR(
                run(sql, [&](Statement& s) { s.Text(1, o.job); }));
          }
          return run(
              "INSERT INTO version_floors(job, version) VALUES(?, ?) "
              "ON CONFLICT(job) DO UPDATE SET "
              "version = max(version, excluded.version)",
              [&](Statement& s) { s.Text(1, o.job).Int(2, o.last_version); });
        } else if constexpr (std::is_same_v<T, store_op::PutWorker>) {
          return run(
              "INSERT OR REPLACE INTO workers(job, worker_id, join_request, "
              "join_time_ms, token, join_seq, draining, certificate) "
              "VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
              [&](Statement& s) {
                s.Text(1, o.job)
                    .Text(2, o.worker.worker_id)
                    .Blob(3,
                          JoinRequestToProto(o.worker.join).SerializeAsString())
                    .Int(4, o.worker.join_time_ms)
                    .Text(5, o.worker.token)
                    .Int(6, o.worker.join_seq)
                    .Int(7, o.worker.draining ? 1 : 0)
                    .Text(8, o.worker.join.certificate);
              });
        } else if constexpr (std::is_same_v<T, store_op::DeleteWorker>) {
          return run(
              "DELETE FROM workers WHERE job = ? AND worker_id = ?",
              [&](Statement& s) { s.Text(1, o.job).Text(2, o.worker_id); });
        } else if constexpr (std::is_same_v<T, store_op::PutPlan>) {
          return run(
              "INSERT OR REPLACE INTO plans(job, version, plan, nccl_id, "
              "nccl_generation) VALUES(?, ?, ?, ?, ?)",
              [&](Statement& s) {
                s.Text(1, o.job)
                    .Int(2, o.plan->version)
                    .Blob(3, PlanToProto(*o.plan).SerializeAsString())
                    .Blob(4, o.nccl_id)
                    .Int(5, o.nccl_generation);
              });
        } else {
          static_assert(std::is_same_v<T, store_op::PutNcclId>);
          MUONPS_RETURN_IF_ERROR(
              run("UPDATE plans SET nccl_id = ?, nccl_generation = ? "
                  "WHERE job = ? AND version = ?",
                  [&](Statement& s) {
                    s.Blob(1, o.nccl_id)
                        .Int(2, o.nccl_generation)
                        .Text(3, o.job)
                        .Int(4, o.plan_version);
                  }));
          if (sqlite3_changes(db_) != 1) {
            return FieldError(
                absl::StatusCode::kFailedPrecondition, "plan_version",
                absl::StrCat("state store: job ", Quoted(o.job),
                             " has no stored plan version ", o.plan_version));
          }
          return absl::OkStatus();
        }
      },
      op);
}

absl::Status JobStore::Apply(const std::vector<StoreOp>& ops) {
  if (ops.empty()) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  for (const StoreOp& op : ops) {
    const absl::Status applied = ApplyOne(op);
    if (!applied.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return applied;
    }
  }
  const absl::Status committed = Exec("COMMIT");
  if (!committed.ok()) Exec("ROLLBACK").IgnoreError();
  return committed;
}

}  // namespace coordinator
}  // namespace muonps
