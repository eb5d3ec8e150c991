// The example's closed training loop through the real service, as
// deploy/local/launch.sh runs it: a muonps-coordinator, N muonps-worker
// daemons and N mlp_trainer processes train the MLP for 50 steps, and
// trainer rank 0 compares its final parameters (weights and the biases
// that AdamW steps in the clients) with a single-process run of the same
// kernels. The loop amplifies any rounding difference by orders of
// magnitude within 50 steps (examples/trainer/training_test.cc), so the
// 1e-5 bound holds only if the service computes exactly what the
// reference does: the plan's Newton-Schulz algorithm per matrix, means
// summed in trainer order whichever order the workers joined in. Every
// layout, 1, 2 and 3 workers.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::ChildProcess;
using testing::NewTempDir;
using testing::RunfilePath;

constexpr int kSteps = 50;
constexpr double kTolerance = 1e-5;
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kTrainTimeout = absl::Seconds(240);

struct ParityCase {
  std::string layout;
  int workers = 1;    // each with a trainer
  int dedicated = 0;  // workers with no trainer (--dedicated)
};

void PrintTo(const ParityCase& c, std::ostream* os) {
  *os << c.layout << "_" << c.workers << "_" << c.dedicated;
}

// The number after "key": in the trainer's JSON summary line.
bool JsonNumber(const std::string& text, const std::string& key, double* out) {
  const std::string quoted = "\"" + key + "\":";
  const size_t at = text.rfind(quoted);
  if (at == std::string::npos) return false;
  const size_t begin = at + quoted.size();
  const size_t end = text.find_first_of(",}", begin);
  if (end == std::string::npos) return false;
  return absl::SimpleAtod(text.substr(begin, end - begin), out);
}

class TrainingParityTest : public ::testing::TestWithParam<ParityCase> {
 protected:
  void SetUp() override {
    log_dir_ = NewTempDir("training_parity");
    ASSERT_FALSE(log_dir_.empty());
    // Unix socket paths hold at most 108 bytes, too few for TEST_TMPDIR.
    char socket_dir[] = "/tmp/muonps-tp-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_dir_ = socket_dir;
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const auto& p : processes_) {
        std::cerr << "== " << p->log_path() << "\n" << p->Log();
      }
    }
    processes_.clear();  // kills and reaps what still runs
    for (const std::string& dir : {socket_dir_, log_dir_}) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

  ChildProcess* Start(const std::vector<std::string>& argv,
                      const std::string& log) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> started =
        ChildProcess::Start(argv, absl::StrCat(log_dir_, "/", log, ".log"));
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return nullptr;
    processes_.push_back(*std::move(started));
    return processes_.back().get();
  }

  std::string log_dir_, socket_dir_;
  std::vector<std::unique_ptr<ChildProcess>> processes_;
};

TEST_P(TrainingParityTest, FiftyStepsEqualTheSingleProcessRun) {
  const ParityCase& c = GetParam();
  absl::StatusOr<testing::RunningCoordinator> coordinator =
      testing::StartCoordinator(log_dir_ + "/coordinator.log", kStartTimeout);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  processes_.push_back(std::move(coordinator->process));
  const std::string address = coordinator->address;
  // A job name of its own: a worker removes the /dev/shm segments of its
  // job whose trainer pid it cannot see, and tests of other runs (other
  // PID namespaces) share /dev/shm.
  const std::string job = absl::StrCat("--job=parity-", getpid());
  std::vector<ChildProcess*> workers;
  for (int i = 0; i < c.workers; ++i) {
    workers.push_back(Start(
        {RunfilePath("server/worker/muonps-worker"), "--coordinator=" + address,
         job, absl::StrCat("--worker_id=w", i),
         absl::StrCat("--socket=", socket_dir_, "/w", i, ".sock"),
         "--metrics_port=-1", "--device=cpu"},
        absl::StrCat("worker-w", i)));
    ASSERT_NE(workers.back(), nullptr);
  }
  for (ChildProcess* w : workers) {
    ASSERT_TRUE(w->WaitForLog("listening on unix:", kStartTimeout).ok());
  }
  // Dedicated workers: the trainers' job expects them
  // (--dedicated_workers), so no trainer attaches to a plan without them.
  std::vector<ChildProcess*> dedicated;
  for (int i = 0; i < c.dedicated; ++i) {
    dedicated.push_back(Start(
        {RunfilePath("server/worker/muonps-worker"), "--coordinator=" + address,
         job, absl::StrCat("--worker_id=d", i),
         absl::StrCat("--socket=", socket_dir_, "/d", i, ".sock"),
         "--metrics_port=-1", "--device=cpu", "--dedicated"},
        absl::StrCat("worker-d", i)));
    ASSERT_NE(dedicated.back(), nullptr);
  }
  std::vector<ChildProcess*> trainers;
  for (int r = 0; r < c.workers; ++r) {
    trainers.push_back(
        Start({RunfilePath("examples/trainer/mlp_trainer"),
               "--coordinator=" + address, job,
               absl::StrCat("--worker_socket=", socket_dir_, "/w", r, ".sock"),
               absl::StrCat("--rank=", r), absl::StrCat("--ranks=", c.workers),
               "--layout=" + c.layout, absl::StrCat("--steps=", kSteps),
               absl::StrCat("--parity=", r == 0 ? "true" : "false"),
               absl::StrCat("--dedicated_workers=", c.dedicated)},
              absl::StrCat("trainer-", r)));
    ASSERT_NE(trainers.back(), nullptr);
  }
  for (ChildProcess* t : trainers) {
    absl::StatusOr<int> status = t->Wait(kTrainTimeout);
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << t->log_path() << ":\n"
        << t->Log();
  }
  for (ChildProcess* d : dedicated) {
    EXPECT_NE(d->Log().find("(dedicated) first step"), std::string::npos)
        << d->Log();
  }
  const std::string log = trainers[0]->Log();
  double err = 0;
  ASSERT_TRUE(JsonNumber(log, "parity_max_rel_err", &err)) << log;
  EXPECT_LE(err, kTolerance) << c.layout << " with " << c.workers
                             << " workers after " << kSteps << " steps";
  double final_loss = 0;
  ASSERT_TRUE(JsonNumber(log, "final_loss", &final_loss)) << log;
  EXPECT_LT(final_loss, 0.6) << "training should make progress";
}

std::vector<ParityCase> AllCases() {
  std::vector<ParityCase> cases;
  for (const char* layout : {"replicated", "unreduced", "row_sharded"}) {
    for (int workers = 1; workers <= 3; ++workers) {
      cases.push_back({layout, workers});
    }
    cases.push_back({layout, 2, 1});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TrainingParityTest, ::testing::ValuesIn(AllCases()),
    [](const ::testing::TestParamInfo<ParityCase>& info) {
      return absl::StrCat(
          info.param.layout, "_", info.param.workers, "Workers",
          info.param.dedicated > 0
              ? absl::StrCat("_", info.param.dedicated, "Dedicated")
              : "");
    });

}  // namespace
}  // namespace muonps
