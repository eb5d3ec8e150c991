// JobStore: what Apply commits is what Load reads back after a reopen, a
// failed batch leaves nothing behind, a process killed at any moment
// leaves every acknowledged batch (and no half of one), one process at a
// time holds the directory, and bad files are refused by name.
#include "server/coordinator/job_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/record_wire.h"

namespace muonps {
namespace coordinator {
namespace {

using ::testing::HasSubstr;

class JobStoreTest : public ::testing::Test {
 protected:
  JobStoreTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/job_store_XXXXXX");
    EXPECT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern + "/state";
  }
  ~JobStoreTest() override {
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(dir_).parent_path(),
                                ignored);
  }

  std::unique_ptr<JobStore> OpenOk() {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  std::string dir_;
};

// One 8 x 16 matrix, "layers.0.w".
std::shared_ptr<const JobSpec> Spec(const std::string& name) {
  auto spec = std::make_shared<JobSpec>();
  spec->name = name;
  scheduler::MatrixSpec m;
  m.name = "layers.0.w";
  m.rows = 8;
  m.cols = 16;
  spec->matrices.push_back(m);
  spec->unset.push_back({.experts = true, .dtype = true, .layout = true});
  return spec;
}

StoredJob Job(const std::string& name) {
  StoredJob job;
  job.name = name;
  job.spec = Spec(name);
  job.create_request_id = "req-" + name;
  job.create_time_ms = 1700000000123;
  job.job_token = "job-token-" + name;
  job.data_plane_secret = "secret-" + name;
  return job;
}

StoredWorker Worker(const std::string& id, int64_t seq) {
  StoredWorker w;
  w.worker_id = id;
  w.join.worker_id = id;
  w.join.instance_id = "instance-" + id;
  w.join.data_address = id + ":7001";
  w.join_time_ms = 1700000000000 + seq;
  w.token = "token-" + id;
  w.join_seq = seq;
  return w;
}

// The job's matrix owned by the first of `workers`.
std::shared_ptr<const PublishedPlan> Plan(const std::string& job,
                                          int64_t version,
                                          std::vector<std::string> workers) {
  auto plan = std::make_shared<PublishedPlan>();
  plan->job = job;
  plan->version = version;
  plan->reason = "test";
  const std::shared_ptr<const JobSpec> spec = Spec(job);
  plan->matrices = std::shared_ptr<const std::vector<scheduler::MatrixSpec>>(
      spec, &spec->matrices);
  scheduler::OwnershipPlan& o = plan->ownership;
  o.matrix_names = {"layers.0.w"};
  o.worker_ids = std::move(workers);
  o.owners = {{0}};
  o.worker_seconds.assign(o.worker_ids.size(), 0.5);
  o.worker_memory_bytes.assign(o.worker_ids.size(), 1024);
  o.worker_momentum_bytes.assign(o.worker_ids.size(), 512);
  o.worker_link_bytes.assign(o.worker_ids.size(), 0);
  plan->buckets.push_back({{0}, 0, 0, 512});
  return plan;
}

TEST_F(JobStoreTest, AppliedChangesAreLoadedBackAfterReopen) {
  {
    std::unique_ptr<JobStore> store = OpenOk();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(
        store
            ->Apply({store_op::PutJob{Job("a")},
                     store_op::PutWorker{"a", Worker("w1", 1)},
                     store_op::PutWorker{"a", Worker("w2", 2)},
                     store_op::PutPlan{"a", Plan("a", 2, {"w1", "w2"}), "", 0}})
            .ok());
    ASSERT_TRUE(
        store
            ->Apply({store_op::PutNcclId{"a", 2, std::string(128, 'n'), 3},
                     store_op::PutJob{Job("b")},
                     store_op::PutWorker{"b", Worker("w1", 1)},
                     store_op::DeleteWorker{"a", "w1"}})
            .ok());
  }
  std::unique_ptr<JobStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  const absl::StatusOr<StoredState> state = store->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 2u);
  const StoredJob& a = state->jobs[0];
  EXPECT_EQ(a.name, "a");
  // Kept as their muonps.v1 messages: read back as written.
  EXPECT_EQ(JobSpecToProto(*a.spec).SerializeAsString(),
            JobSpecToProto(*Spec("a")).SerializeAsString());
  EXPECT_EQ(a.create_request_id, "req-a");
  EXPECT_EQ(a.create_time_ms, 1700000000123);
  EXPECT_EQ(a.job_token, "job-token-a");
  EXPECT_EQ(a.data_plane_secret, "secret-a");
  ASSERT_EQ(a.workers.size(), 1u);
  EXPECT_EQ(a.workers[0].worker_id, "w2");
  EXPECT_EQ(a.workers[0].token, "token-w2");
  EXPECT_EQ(a.workers[0].join.instance_id, "instance-w2");
  EXPECT_EQ(a.workers[0].join_seq, 2);
  ASSERT_TRUE(a.plan.has_value());
  EXPECT_EQ(a.plan->version, 2);
  ASSERT_TRUE(a.plan->plan.ok()) << a.plan->plan.status();
  EXPECT_EQ(PlanToProto(**a.plan->plan).SerializeAsString(),
            PlanToProto(*Plan("a", 2, {"w1", "w2"})).SerializeAsString());
  EXPECT_EQ(a.plan->nccl_id, std::string(128, 'n'));
  EXPECT_EQ(a.plan->nccl_generation, 3);
  EXPECT_EQ(state->jobs[1].name, "b");
  EXPECT_FALSE(state->jobs[1].plan.has_value());
  EXPECT_TRUE(state->version_floors.empty());
}

TEST_F(JobStoreTest, DeleteJobDropsItsRowsAndKeepsItsHighestVersionAsFloor) {
  std::unique_ptr<JobStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store
                  ->Apply({store_op::PutJob{Job("a")},
                           store_op::PutWorker{"a", Worker("w1", 1)},
                           store_op::PutPlan{"a", Plan("a", 9, {"w1"}), "", 0},
                           store_op::DeleteJob{"a", 9}})
                  .ok());
  // A later, lower floor (a recreated job deleted early) keeps the highest.
  ASSERT_TRUE(
      store->Apply({store_op::PutJob{Job("a")}, store_op::DeleteJob{"a", 4}})
          .ok());
  const absl::StatusOr<StoredState> state = store->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->jobs.empty());
  ASSERT_EQ(state->version_floors.count("a"), 1u);
  EXPECT_EQ(state->version_floors.at("a"), 9);
}

TEST_F(JobStoreTest, AFailedBatchAppliesNothingOfIt) {
  std::unique_ptr<JobStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  // The NCCL id names a plan that is not stored: the whole batch fails.
  const absl::Status failed =
      store->Apply({store_op::PutJob{Job("a")},
                    store_op::PutNcclId{"a", 5, std::string(128, 'n'), 0}});
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("plan_version"));
  const absl::StatusOr<StoredState> state = store->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->jobs.empty());
  // And the store still takes the next one.
  EXPECT_TRUE(store->Apply({store_op::PutJob{Job("a")}}).ok());
}

TEST_F(JobStoreTest, ASecondOpenOfTheDirectoryIsRefusedNamingItAndTheHolder) {
  std::unique_ptr<JobStore> first = OpenOk();
  ASSERT_NE(first, nullptr);
  const absl::StatusOr<std::unique_ptr<JobStore>> second = JobStore::Open(dir_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("state_dir: \"", dir_, "\" is locked")));
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("pid ", getpid())));
  first.reset();  // releases the lock
  EXPECT_NE(OpenOk(), nullptr);
}

TEST_F(JobStoreTest, DirectoryAndDatabaseAreTheOwnersOnly) {
  ASSERT_NE(OpenOk(), nullptr);
  struct stat st;
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir_ + "/coordinator.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(JobStoreTest, AFileThatIsNotADatabaseIsDataLossNamingIt) {
  ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
  std::ofstream(dir_ + "/coordinator.db")
      << std::string(4096, 'x') << "not sqlite";
  const absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
      << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(dir_ + "/coordinator.db"));
}

TEST_F(JobStoreTest, AnUnknownSchemaVersionIsRefused) {
  ASSERT_NE(OpenOk(), nullptr);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/coordinator.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE meta SET value = 99 WHERE key = "
                         "'schema_version'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("schema version 99"));
}

// A store written by a build without draining (schema version 1: no
// draining column) opens, keeps its members (not draining), and stores a
// draining member from then on.
TEST_F(JobStoreTest, AVersionOneStoreIsMigratedAndKeepsItsMembers) {
  {
    std::unique_ptr<JobStore> store = OpenOk();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store
                    ->Apply({store_op::PutJob{Job("a")},
                             store_op::PutWorker{"a", Worker("w1", 1)}})
                    .ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/coordinator.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "ALTER TABLE workers DROP COLUMN draining; "
                         "ALTER TABLE workers DROP COLUMN certificate; "
                         "UPDATE meta SET value = 1 WHERE key = "
                         "'schema_version'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  {
    std::unique_ptr<JobStore> store = OpenOk();
    ASSERT_NE(store, nullptr);
    absl::StatusOr<StoredState> state = store->Load();
    ASSERT_TRUE(state.ok()) << state.status();
    ASSERT_EQ(state->jobs.size(), 1u);
    ASSERT_EQ(state->jobs[0].workers.size(), 1u);
    EXPECT_FALSE(state->jobs[0].workers[0].draining);
    EXPECT_EQ(state->jobs[0].workers[0].join.certificate, "");
    StoredWorker leaving = Worker("w1", 1);
    leaving.draining = true;
    leaving.join.certificate = "CN=w1 sha256:ab";
    ASSERT_TRUE(store->Apply({store_op::PutWorker{"a", leaving}}).ok());
  }
  std::unique_ptr<JobStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<StoredState> state = store->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs[0].workers.size(), 1u);
  EXPECT_TRUE(state->jobs[0].workers[0].draining);
  EXPECT_EQ(state->jobs[0].workers[0].join.certificate, "CN=w1 sha256:ab");
}

TEST_F(JobStoreTest, KillNineAtAnyMomentKeepsEveryAcknowledgedBatchWhole) {
  // A child applies batches of (job, worker, plan) and acknowledges each on
  // a pipe; it is SIGKILLed while writing. Every acknowledged batch must be
  // there whole, and a batch is there only whole.
  for (int round = 0; round < 3; ++round) {
    int ack[2];
    ASSERT_EQ(pipe(ack), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(ack[0]);
      absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
      if (!store.ok()) _exit(2);
      for (int i = round * 1000;; ++i) {
        const std::string name = absl::StrCat("j", i);
        if (!(*store)
                 ->Apply({store_op::PutJob{Job(name)},
                          store_op::PutWorker{name, Worker("w", 1)},
                          store_op::PutPlan{name, Plan(name, 1, {"w"}), "", 0}})
                 .ok()) {
          _exit(3);
        }
        if (write(ack[1], &i, sizeof(i)) != sizeof(i)) _exit(4);
      }
    }
    close(ack[1]);
    int last = -1, acknowledged = 0;
    while (acknowledged < 5 + round * 7 &&
           read(ack[0], &last, sizeof(last)) == sizeof(last)) {
      ++acknowledged;
    }
    kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited " << status;
    close(ack[0]);
    ASSERT_GE(last, round * 1000);
    std::unique_ptr<JobStore> store = OpenOk();
    ASSERT_NE(store, nullptr);
    const absl::StatusOr<StoredState> state = store->Load();
    ASSERT_TRUE(state.ok()) << state.status();
    std::set<std::string> names;
    for (const StoredJob& job : state->jobs) {
      names.insert(job.name);
      EXPECT_EQ(job.workers.size(), 1u) << job.name << " is half there";
      EXPECT_TRUE(job.plan.has_value()) << job.name << " is half there";
    }
    for (int i = round * 1000; i <= last; ++i) {
      EXPECT_EQ(names.count(absl::StrCat("j", i)), 1u)
          << "acknowledged batch j" << i << " is lost";
    }
  }
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
