// The control plane with real processes on loopback: one muonps-coordinator
// and several muonps-worker daemons. Proves that joining workers get a
// complete ownership plan, that a SIGKILLed worker's lease expires and its
// matrices move to the survivors (and little else moves), that it rejoins
// when restarted, that WatchPlan streams versions as they happen, that both
// binaries serve valid Prometheus text, and that SIGTERM ends every process
// cleanly.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using ::muonps::testing::ChildProcess;
using ::muonps::testing::NewTempDir;
using ::muonps::testing::RunfilePath;

constexpr char kJob[] = "tiny-moe";
constexpr int64_t kLeaseTtlMs = 1500;
constexpr int64_t kHeartbeatMs = 300;
constexpr int64_t kWorkerMemoryBytes = int64_t{16} << 30;
constexpr absl::Duration kLeaseTtl = absl::Milliseconds(kLeaseTtlMs);
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kWaitTimeout = absl::Seconds(15);

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return DeadlineIn(d);
}

absl::Status FromGrpc(const grpc::Status& s) {
  return ::muonps::FromGrpc(s, "");
}

// Eight layers of a small MoE transformer: square and rectangular attention
// shapes, dense MLPs on even layers, 8-expert stacks on odd ones, and every
// layout and dtype a trainer may register.
v1::JobSpec TinyMoeSpec() {
  v1::JobSpec spec;
  spec.set_name(kJob);
  spec.set_bucket_bytes(int64_t{4} << 20);
  spec.mutable_muon()->set_lr(0.02);
  spec.mutable_muon()->set_weight_decay(0.01);
  auto add = [&spec](const std::string& name, int64_t rows, int64_t cols,
                     int64_t experts, v1::Layout layout, v1::DType dtype,
                     int layer) {
    v1::Matrix* m = spec.add_matrices();
    m->set_name(name);
    m->set_rows(rows);
    m->set_cols(cols);
    m->set_experts(experts);
    m->set_layout(layout);
    m->set_dtype(dtype);
    m->set_layer(layer);
  };
  for (int l = 0; l < 8; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attn.q", 512, 512, 0, v1::LAYOUT_REPLICATED, v1::DTYPE_BF16, l);
    add(p + "attn.kv", 256, 512, 0, v1::LAYOUT_UNREDUCED, v1::DTYPE_BF16, l);
    add(p + "attn.o", 512, 512, 0, v1::LAYOUT_REPLICATED, v1::DTYPE_BF16, l);
    if (l % 2 == 0) {
      add(p + "mlp.up", 1408, 512, 0, v1::LAYOUT_ROW_SHARDED, v1::DTYPE_BF16,
          l);
      add(p + "mlp.down", 512, 1408, 0, v1::LAYOUT_ROW_SHARDED, v1::DTYPE_FP32,
          l);
    } else {
      add(p + "moe.router", 8, 512, 0, v1::LAYOUT_REPLICATED, v1::DTYPE_FP32,
          l);
      add(p + "moe.up", 512, 256, 8, v1::LAYOUT_UNREDUCED, v1::DTYPE_BF16, l);
      add(p + "moe.down", 256, 512, 8, v1::LAYOUT_UNREDUCED, v1::DTYPE_FP16, l);
    }
  }
  return spec;
}

// Every owned item of a plan ("name" or "name[expert]") with its owner and
// fp32 momentum bytes.
struct Item {
  std::string owner;
  int64_t momentum_bytes;
};
std::map<std::string, Item> ItemsOf(const v1::Plan& plan) {
  std::map<std::string, Item> items;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    for (int e = 0; e < m.owners_size(); ++e) {
      const std::string key =
          m.owners_size() > 1 ? absl::StrCat(m.name(), "[", e, "]") : m.name();
      items[key] = {m.owners(e), m.rows() * m.cols() * 4};
    }
  }
  return items;
}

std::set<std::string> WorkersOf(const v1::Plan& plan) {
  return {plan.workers().begin(), plan.workers().end()};
}

int64_t MomentumOf(const v1::Plan& plan, const std::string& worker_id) {
  for (const v1::WorkerLoad& load : plan.loads()) {
    if (load.worker_id() == worker_id) return load.momentum_bytes();
  }
  return -1;
}

// One sample line of the Prometheus text format.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value;
};

// Reads a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or, without colons, a
// label name, from line[*pos]; empty if there is none.
std::string ReadName(const std::string& line, size_t* pos, bool metric) {
  const size_t start = *pos;
  for (; *pos < line.size(); ++*pos) {
    const char c = line[*pos];
    if (!(std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
          (metric && c == ':') ||
          (*pos > start && std::isdigit(static_cast<unsigned char>(c))))) {
      break;
    }
  }
  return line.substr(start, *pos - start);
}

bool ParseValue(const std::string& token, double* value) {
  if (token == "+Inf" || token == "-Inf" || token == "NaN") {
    *value = token == "NaN" ? NAN : (token[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  return !token.empty() &&
         token.find_first_not_of("0123456789+-.eE") == std::string::npos &&
         absl::SimpleAtod(token, value);
}

// Parses one sample line: name{label="value",...} value [timestamp].
absl::StatusOr<Sample> ParseSample(const std::string& line) {
  Sample s;
  size_t pos = 0;
  s.name = ReadName(line, &pos, /*metric=*/true);
  if (s.name.empty()) return absl::InvalidArgumentError("no metric name");
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    while (pos < line.size() && line[pos] != '}') {
      const std::string label = ReadName(line, &pos, /*metric=*/false);
      if (label.empty() || line.compare(pos, 2, "=\"") != 0) {
        return absl::InvalidArgumentError("a malformed label");
      }
      std::string value;
      for (pos += 2; pos < line.size() && line[pos] != '"'; ++pos) {
        if (line[pos] == '\\') {
          if (++pos == line.size() ||
              std::string("\\\"n").find(line[pos]) == std::string::npos) {
            return absl::InvalidArgumentError("a bad escape in a label value");
          }
        }
        value += line[pos];
      }
      if (pos++ == line.size()) {
        return absl::InvalidArgumentError("an unterminated label value");
      }
      if (!s.labels.emplace(label, value).second) {
        return absl::InvalidArgumentError("a label twice");
      }
      if (pos < line.size() && line[pos] == ',') ++pos;
    }
    if (pos++ == line.size()) return absl::InvalidArgumentError("no '}'");
  }
  const std::vector<std::string> rest =
      absl::StrSplit(line.substr(std::min(pos, line.size())), ' ');
  // rest: "", value[, timestamp]
  if (rest.size() < 2 || rest.size() > 3 || !rest[0].empty() ||
      !ParseValue(rest[1], &s.value)) {
    return absl::InvalidArgumentError("no float value after the name");
  }
  int64_t timestamp;
  if (rest.size() == 3 && !absl::SimpleAtoi(rest[2], &timestamp)) {
    return absl::InvalidArgumentError("a bad timestamp");
  }
  return s;
}

// Parses the text exposition format (0.0.4), checking every line: HELP and
// TYPE comments, metric and label names, label quoting, float values, a
// TYPE for every sample's family, and cumulative histogram buckets whose
// +Inf bucket equals _count.
absl::StatusOr<std::vector<Sample>> ParsePrometheusText(
    const std::string& text) {
  if (text.empty() || text.back() != '\n') {
    return absl::InvalidArgumentError("the text does not end in a newline");
  }
  const std::set<std::string> kinds = {"counter", "gauge", "histogram",
                                       "summary", "untyped"};
  std::map<std::string, std::string> types;
  std::vector<Sample> samples;
  std::map<std::string, double> last_bucket;  // per series, without "le"
  std::map<std::string, double> inf_bucket;
  const std::vector<std::string> lines =
      absl::StrSplit(text.substr(0, text.size() - 1), '\n');
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", n + 1, " \"", line, "\": ", why));
    };
    if (absl::StartsWith(line, "# HELP ") ||
        absl::StartsWith(line, "# TYPE ")) {
      size_t pos = 7;
      const std::string name = ReadName(line, &pos, /*metric=*/true);
      if (name.empty()) return bad("no metric name");
      if (line[2] == 'H') {
        if (pos < line.size() && line[pos] != ' ') return bad("a bad name");
        continue;
      }
      if (pos >= line.size() || kinds.count(line.substr(pos + 1)) == 0) {
        return bad("an unknown type");
      }
      if (!types.emplace(name, line.substr(pos + 1)).second) {
        return bad("a second TYPE");
      }
      continue;
    }
    if (!line.empty() && line[0] == '#') return bad("a malformed comment");
    absl::StatusOr<Sample> s = ParseSample(line);
    if (!s.ok()) return bad(s.status().message());
    std::string family = s->name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (types.count(family) == 0 && absl::EndsWith(family, suffix)) {
        family.resize(family.size() - strlen(suffix));
      }
    }
    if (types.count(family) == 0) return bad("no TYPE for its family");
    if (family != s->name && types[family] != "histogram" &&
        types[family] != "summary") {
      return bad("a suffix on a family that is no histogram");
    }
    if (types[family] == "histogram") {
      std::map<std::string, std::string> series = s->labels;
      series.erase("le");
      const std::string key =
          absl::StrJoin(series, ",", absl::PairFormatter("="));
      if (s->name == family + "_bucket") {
        if (s->labels.count("le") == 0) return bad("a bucket without le");
        if (last_bucket.count(key) != 0 && s->value < last_bucket[key]) {
          return bad("buckets are not cumulative");
        }
        last_bucket[key] = s->value;
        if (s->labels["le"] == "+Inf") inf_bucket[family + key] = s->value;
      } else if (s->name == family + "_count" &&
                 (inf_bucket.count(family + key) == 0 ||
                  inf_bucket[family + key] != s->value)) {
        return bad("_count differs from the +Inf bucket");
      }
    }
    samples.push_back(*std::move(s));
  }
  return samples;
}

// Values of the samples named `name` whose labels include `labels`.
std::vector<double> Values(const std::vector<Sample>& samples,
                           const std::string& name,
                           const std::map<std::string, std::string>& labels) {
  std::vector<double> out;
  for (const Sample& s : samples) {
    bool match = s.name == name;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) out.push_back(s.value);
  }
  return out;
}

absl::StatusOr<std::vector<Sample>> ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  if (!result) {
    return absl::UnavailableError(httplib::to_string(result.error()));
  }
  if (result->status != 200) {
    return absl::UnavailableError(absl::StrCat("HTTP ", result->status));
  }
  return ParsePrometheusText(result->body);
}

bool ExitedZero(const absl::StatusOr<int>& wait_status) {
  return wait_status.ok() && WIFEXITED(*wait_status) &&
         WEXITSTATUS(*wait_status) == 0;
}

// The validator below rejects what Prometheus would reject, so that the
// scrapes it accepts mean something.
TEST(PrometheusTextTest, ParserAcceptsTheFormatAndRejectsMalformedLines) {
  const std::string head = "# HELP m_seconds h\n# TYPE m_seconds histogram\n";
  const std::string good =
      head +
      "m_seconds_bucket{a=\"x\\\"y\",le=\"1\"} 1\n"
      "m_seconds_bucket{a=\"x\\\"y\",le=\"+Inf\"} 2\n"
      "m_seconds_sum{a=\"x\\\"y\"} 1.5e-3\nm_seconds_count{a=\"x\\\"y\"} 2\n";
  absl::StatusOr<std::vector<Sample>> parsed = ParsePrometheusText(good);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 4u);
  EXPECT_EQ((*parsed)[0].labels.at("a"), "x\"y");
  EXPECT_EQ((*parsed)[2].value, 1.5e-3);
  for (const std::string& bad : {
           std::string("m 1\n"),                       // no TYPE
           head + "m_seconds_bucket{le=\"1\"} one\n",  // not a float
           head + "m_seconds_bucket{le=1} 1\n",        // unquoted label
           head + "m_seconds_bucket{1e=\"1\"} 1\n",    // bad label name
           head + "m_seconds_bucket{le=\"1\"} 2\n"     // not cumulative
                  "m_seconds_bucket{le=\"+Inf\"} 1\n",
           head + "m_seconds_bucket{le=\"+Inf\"} 2\nm_seconds_count 3\n",
           head + "m_seconds_count 0",  // no final newline
           std::string("# TYPE m countr\nm 1\n"),
           std::string("#TYPE m counter\nm 1\n"),
       }) {
    EXPECT_FALSE(ParsePrometheusText(bad).ok()) << bad;
  }
}

// A coordinator with short leases, the job created, and workers started on
// demand; every process, socket and log is removed when the test ends.
class ControlPlaneTest : public ::testing::Test {
 protected:
  struct Worker {
    std::string socket;
    std::unique_ptr<ChildProcess> process;
    int metrics_port = 0;
  };

  ~ControlPlaneTest() override {
    for (auto& [id, worker] : workers_) {
      worker.process.reset();  // SIGKILLs it if it still runs
    }
    coordinator_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_);
  }

  void SetUp() override {
    dir_ = NewTempDir("control_plane");
    ASSERT_FALSE(dir_.empty());
    // Unix socket paths hold at most 108 bytes, too few for TEST_TMPDIR; and
    // sandboxed runs share /tmp while their pids coincide, so mkdtemp.
    std::string socket_dir = "/tmp/muonps-test-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir.data()), nullptr);
    socket_dir_ = socket_dir;
    std::vector<std::string> argv = {
        RunfilePath("server/coordinator/muonps-coordinator"), "--port=0",
        "--metrics_port=0", absl::StrCat("--lease_ttl_ms=", kLeaseTtlMs),
        absl::StrCat("--heartbeat_interval_ms=", kHeartbeatMs)};
    for (std::string& flag : testing::SecuredCoordinatorFlags()) {
      argv.push_back(std::move(flag));
    }
    absl::StatusOr<std::unique_ptr<ChildProcess>> started =
        ChildProcess::Start(argv, dir_ + "/coordinator.log");
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    absl::StatusOr<std::string> port = coordinator_->WaitForLog(
        R"(listening on 127\.0\.0\.1:(\d+))", kStartTimeout);
    ASSERT_TRUE(port.ok()) << port.status();
    absl::StatusOr<std::string> metrics = coordinator_->WaitForLog(
        R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kStartTimeout);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    ASSERT_TRUE(absl::SimpleAtoi(*metrics, &metrics_port_));
    address_ = absl::StrCat("127.0.0.1:", *port);
    stub_ = v1::Coordinator::NewStub(testing::TestChannel(address_));

    v1::CreateJobRequest request;
    request.set_request_id("control-plane-test-create");
    *request.mutable_job() = TinyMoeSpec();
    absl::StatusOr<v1::Job> job =
        Call(&v1::Coordinator::Stub::CreateJob, request);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->name(), absl::StrCat("jobs/", kJob));
    EXPECT_EQ(job->plan_version(), 0);
  }

  void TearDown() override {
    if (!HasFailure()) return;
    if (coordinator_)
      std::cerr << "== coordinator log\n" << coordinator_->Log();
    for (const auto& [id, worker] : workers_) {
      if (worker.process)
        std::cerr << "== " << id << " log\n" << worker.process->Log();
    }
  }

  // Starts (or restarts) worker `id` and waits until it serves.
  void StartWorker(const std::string& id) {
    Worker& w = workers_[id];
    w.socket = absl::StrCat(socket_dir_, "/", id, ".sock");
    const std::string log =
        absl::StrCat(dir_, "/", id, "-", restarts_++, ".log");
    absl::StatusOr<std::unique_ptr<ChildProcess>> started = ChildProcess::Start(
        {RunfilePath("server/worker/muonps-worker"),
         "--coordinator=" + address_, absl::StrCat("--job=", kJob),
         "--worker_id=" + id, "--socket=" + w.socket, "--metrics_port=0",
         "--device=cpu", absl::StrCat("--memory_bytes=", kWorkerMemoryBytes)},
        log);
    ASSERT_TRUE(started.ok()) << started.status();
    w.process = *std::move(started);
    ASSERT_TRUE(
        w.process->WaitForLog("listening on unix:", kStartTimeout).ok());
    absl::StatusOr<std::string> port = w.process->WaitForLog(
        R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kStartTimeout);
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_TRUE(absl::SimpleAtoi(*port, &w.metrics_port));
  }

  // A unary Coordinator call with a deadline.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                    const Request&, Response*),
      const Request& request) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    Response response;
    const grpc::Status status =
        (stub_.get()->*method)(&context, request, &response);
    if (!status.ok()) return FromGrpc(status);
    return response;
  }

  absl::StatusOr<v1::Plan> GetPlan(int64_t version) {
    v1::GetPlanRequest request;
    request.set_job(kJob);
    request.set_version(version);
    return Call(&v1::Coordinator::Stub::GetPlan, request);
  }

  // Polls the latest plan until its workers are exactly `workers`.
  absl::StatusOr<v1::Plan> WaitForPlanOf(const std::set<std::string>& workers,
                                         absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::StatusOr<v1::Plan> plan;
    while (absl::Now() < deadline) {
      plan = GetPlan(0);
      if (plan.ok() && WorkersOf(*plan) == workers) return plan;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("no plan of [", absl::StrJoin(workers, ","), "]; last: ",
                     plan.ok() ? plan->ShortDebugString().substr(0, 300)
                               : plan.status().ToString()));
  }

  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() {
    v1::ListWorkersRequest request;
    request.set_job(kJob);
    return Call(&v1::Coordinator::Stub::ListWorkers, request);
  }

  // Polls the worker's local control service until it is ready on
  // `version`.
  absl::StatusOr<v1::WorkerStatus> WaitForWorker(const std::string& id,
                                                 int64_t version) {
    std::unique_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(
        testing::TestChannel("unix:" + workers_.at(id).socket));
    const absl::Time deadline = absl::Now() + kWaitTimeout;
    v1::WorkerStatus status;
    grpc::Status rpc;
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      context.set_deadline(Deadline(absl::Seconds(2)));
      rpc = stub->GetStatus(&context, v1::GetStatusRequest(), &status);
      if (rpc.ok() && status.state() == "ready" &&
          status.plan_version() == version) {
        return status;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(
        absl::StrCat(id, " is not ready on plan_version ", version, ": ",
                     rpc.error_message(), " ", status.ShortDebugString()));
  }

  // The worker's view agrees with `plan`: ready, its rank, what it owns.
  void ExpectWorkerFollows(const std::string& id, const v1::Plan& plan) {
    absl::StatusOr<v1::WorkerStatus> status = WaitForWorker(id, plan.version());
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->worker_id(), id);
    EXPECT_EQ(status->job(), kJob);
    EXPECT_EQ(status->coordinator(), address_);
    const auto rank =
        std::find(plan.workers().begin(), plan.workers().end(), id);
    ASSERT_NE(rank, plan.workers().end());
    EXPECT_EQ(status->rank(), rank - plan.workers().begin());
    int64_t owned = 0;
    for (const auto& [name, item] : ItemsOf(plan)) owned += item.owner == id;
    EXPECT_EQ(status->owned_matrices(), owned);
    EXPECT_EQ(status->owned_momentum_bytes(), MomentumOf(plan, id));
  }

  std::string dir_;         // logs
  std::string socket_dir_;  // under /tmp
  std::unique_ptr<ChildProcess> coordinator_;
  std::string address_;
  int metrics_port_ = 0;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::map<std::string, Worker> workers_;
  int restarts_ = 0;
};

// A plan for `workers` owns every matrix of TinyMoeSpec() once (every expert
// of a stack separately) by one of them, batches and buckets each exactly
// once, and its loads and bounds are consistent.
void ExpectCompletePlan(const v1::Plan& plan,
                        const std::set<std::string>& workers) {
  const v1::JobSpec spec = TinyMoeSpec();
  EXPECT_EQ(plan.name(),
            absl::StrCat("jobs/", kJob, "/plans/", plan.version()));
  EXPECT_EQ(WorkersOf(plan), workers);
  EXPECT_EQ(plan.workers_size(), static_cast<int>(workers.size()));
  ASSERT_EQ(plan.matrices_size(), spec.matrices_size());
  int64_t total_bytes = 0;
  for (int i = 0; i < spec.matrices_size(); ++i) {
    const v1::Matrix& want = spec.matrices(i);
    const v1::MatrixPlacement& got = plan.matrices(i);
    EXPECT_EQ(got.name(), want.name());
    EXPECT_EQ(got.owners_size(), std::max<int64_t>(1, want.experts()));
    for (const std::string& owner : got.owners()) {
      EXPECT_EQ(workers.count(owner), 1u)
          << got.name() << " owned by " << owner;
    }
    ASSERT_GE(got.bucket(), 0);
    ASSERT_LT(got.bucket(), plan.buckets_size());
    const auto& in_bucket = plan.buckets(got.bucket()).matrices();
    EXPECT_NE(std::find(in_bucket.begin(), in_bucket.end(), got.name()),
              in_bucket.end())
        << got.name() << " is not in its bucket " << got.bucket();
    total_bytes += got.owners_size() * want.rows() * want.cols() * 4;
  }
  std::multiset<std::string> bucketed;
  for (const v1::Bucket& b : plan.buckets()) {
    bucketed.insert(b.matrices().begin(), b.matrices().end());
    EXPECT_GT(b.bytes(), 0);
  }
  std::multiset<std::string> names;
  for (const v1::Matrix& m : spec.matrices()) names.insert(m.name());
  EXPECT_EQ(bucketed, names);

  const std::map<std::string, Item> items = ItemsOf(plan);
  size_t batched = 0;
  for (const v1::Batch& batch : plan.batches()) {
    for (const std::string& member : batch.matrices()) {
      ++batched;
      ASSERT_EQ(items.count(member), 1u) << member;
      EXPECT_EQ(items.at(member).owner, batch.worker_id()) << member;
    }
  }
  EXPECT_EQ(batched, items.size());

  ASSERT_EQ(plan.loads_size(), static_cast<int>(workers.size()));
  int64_t load_bytes = 0;
  for (const v1::WorkerLoad& load : plan.loads()) {
    EXPECT_EQ(workers.count(load.worker_id()), 1u);
    int64_t owned = 0;
    for (const auto& [name, item] : items) {
      if (item.owner == load.worker_id()) owned += item.momentum_bytes;
    }
    EXPECT_EQ(load.momentum_bytes(), owned) << load.worker_id();
    EXPECT_GE(load.memory_bytes(), load.momentum_bytes());
    EXPECT_LE(load.memory_bytes(), kWorkerMemoryBytes);
    load_bytes += load.momentum_bytes();
  }
  EXPECT_EQ(load_bytes, total_bytes);
  EXPECT_GE(plan.imbalance(), 1.0);
  EXPECT_GT(plan.lower_bound(), 0.0);
  EXPECT_GE(plan.max_seconds(), plan.lower_bound() * (1 - 1e-9));
  EXPECT_GE(plan.max_seconds(), plan.mean_seconds());
}

// Steps 1-3, 5-6 of the control plane's life: three workers share a plan; a
// SIGKILLed worker is re-planned away within two leases, moving about its
// own momentum only; restarted, it rejoins; metrics and clean shutdown.
TEST_F(ControlPlaneTest, KilledWorkerIsReplannedAwayWithinTwoLeasesAndRejoins) {
  const std::set<std::string> all = {"w0", "w1", "w2"};
  for (const std::string& id : all) ASSERT_NO_FATAL_FAILURE(StartWorker(id));

  absl::StatusOr<v1::Plan> before = WaitForPlanOf(all, kWaitTimeout);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_NO_FATAL_FAILURE(ExpectCompletePlan(*before, all));
  EXPECT_EQ(before->version(), 3);  // one version per join
  for (const std::string& id : all) {
    ASSERT_NO_FATAL_FAILURE(ExpectWorkerFollows(id, *before));
  }
  absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->workers_size(), 3);
  for (const v1::WorkerInfo& w : listed->workers()) {
    EXPECT_EQ(all.count(w.worker_id()), 1u);
    EXPECT_GT(w.lease_remaining_ms(), 0) << w.worker_id();
    EXPECT_LE(w.lease_remaining_ms(), kLeaseTtlMs) << w.worker_id();
    EXPECT_EQ(w.device().kind(), "cpu");
    EXPECT_EQ(w.device().memory_bytes(), kWorkerMemoryBytes);
  }

  // SIGKILL w1: no LeaveJob, only its lease can tell.
  const int64_t w1_bytes = MomentumOf(*before, "w1");
  ASSERT_GT(w1_bytes, 0);
  const absl::Time killed = absl::Now();
  workers_["w1"].process->Signal(SIGKILL);
  absl::StatusOr<v1::Plan> after = WaitForPlanOf({"w0", "w2"}, kWaitTimeout);
  const absl::Duration replanned_in = absl::Now() - killed;
  ASSERT_TRUE(after.ok()) << after.status();
  std::cout << "kill to new plan version: " << replanned_in << "\n";
  EXPECT_LT(replanned_in, 2 * kLeaseTtl);
  // Not before the lease could have run out (last heartbeat <= 1 interval
  // before the kill).
  EXPECT_GT(replanned_in, kLeaseTtl - absl::Milliseconds(2 * kHeartbeatMs));
  EXPECT_EQ(after->version(), before->version() + 1);
  EXPECT_EQ(after->reason(), "lease expired: w1");
  ASSERT_NO_FATAL_FAILURE(ExpectCompletePlan(*after, {"w0", "w2"}));
  EXPECT_TRUE(
      coordinator_->WaitForLog("worker=w1 lease expired", kWaitTimeout).ok());
  const absl::StatusOr<int> w1_status =
      workers_["w1"].process->Wait(absl::Seconds(5));
  ASSERT_TRUE(w1_status.ok()) << w1_status.status();
  EXPECT_TRUE(WIFSIGNALED(*w1_status) && WTERMSIG(*w1_status) == SIGKILL);

  // Every item of w1 moved (it had to); the survivors' items mostly stayed.
  const std::map<std::string, Item> old_items = ItemsOf(*before);
  const std::map<std::string, Item> new_items = ItemsOf(*after);
  int64_t moved_bytes = 0;
  int survivor_items = 0, survivor_moved = 0;
  for (const auto& [name, old_item] : old_items) {
    const Item& now = new_items.at(name);
    if (now.owner != old_item.owner) moved_bytes += old_item.momentum_bytes;
    if (old_item.owner != "w1") {
      ++survivor_items;
      survivor_moved += now.owner != old_item.owner;
    }
  }
  std::cout << "moved " << after->moved_bytes() << " bytes; w1 held "
            << w1_bytes << "; survivors' items moved " << survivor_moved
            << " of " << survivor_items << "\n";
  EXPECT_EQ(after->moved_bytes(), moved_bytes);
  EXPECT_GE(after->moved_bytes(), w1_bytes);
  EXPECT_LE(static_cast<double>(after->moved_bytes()), 1.5 * w1_bytes);
  // A fresh assignment to two workers keeps each item with probability 1/2:
  // it would move survivor_items / 2; a stable re-plan moves at most half
  // of that.
  EXPECT_LE(4 * survivor_moved, survivor_items);
  for (const char* id : {"w0", "w2"}) {
    ASSERT_NO_FATAL_FAILURE(ExpectWorkerFollows(id, *after));
  }
  listed = ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->workers_size(), 2);

  // A new w1 process takes the id back (its old lease is gone).
  ASSERT_NO_FATAL_FAILURE(StartWorker("w1"));
  absl::StatusOr<v1::Plan> rejoined = WaitForPlanOf(all, kWaitTimeout);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->version(), after->version() + 1);
  EXPECT_EQ(rejoined->reason(), "worker w1 joined");
  ASSERT_NO_FATAL_FAILURE(ExpectCompletePlan(*rejoined, all));
  for (const std::string& id : all) {
    ASSERT_NO_FATAL_FAILURE(ExpectWorkerFollows(id, *rejoined));
  }

  // Coordinator metrics: valid text, and the story above in numbers.
  absl::StatusOr<std::vector<Sample>> metrics = ScrapeMetrics(metrics_port_);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  using Labels = std::map<std::string, std::string>;
  EXPECT_EQ(Values(*metrics, "muonps_coordinator_jobs", {}),
            std::vector<double>{1});
  EXPECT_EQ(Values(*metrics, "muonps_coordinator_workers", {}),
            std::vector<double>{3});
  const std::vector<double> lost =
      Values(*metrics, "muonps_coordinator_leases_lost_total", {});
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_GE(lost[0], 1);
  EXPECT_EQ(Values(*metrics, "muonps_coordinator_plan_versions_total", {}),
            std::vector<double>{static_cast<double>(rejoined->version())});
  EXPECT_EQ(Values(*metrics, "muonps_coordinator_rpcs_total",
                   Labels{{"method", "CreateJob"}, {"code", "OK"}}),
            std::vector<double>{1});
  // w0, w1, w2, then w1 again.
  EXPECT_EQ(Values(*metrics, "muonps_coordinator_rpcs_total",
                   Labels{{"method", "JoinJob"}, {"code", "OK"}}),
            std::vector<double>{4});
  const std::vector<double> heartbeats =
      Values(*metrics, "muonps_coordinator_rpcs_total",
             Labels{{"method", "Heartbeat"}, {"code", "OK"}});
  ASSERT_EQ(heartbeats.size(), 1u);
  EXPECT_GE(heartbeats[0], 3);
  EXPECT_EQ(Values(*metrics, "muonps_coordinator_rpc_seconds_bucket",
                   Labels{{"method", "GetPlan"}, {"le", "+Inf"}})
                .size(),
            1u);
  // Worker metrics: the version each one follows.
  for (const std::string& id : all) {
    absl::StatusOr<std::vector<Sample>> worker =
        ScrapeMetrics(workers_[id].metrics_port);
    ASSERT_TRUE(worker.ok()) << id << ": " << worker.status();
    EXPECT_EQ(Values(*worker, "muonps_worker_plan_version", {}),
              std::vector<double>{static_cast<double>(rejoined->version())})
        << id;
  }

  // SIGTERM: workers leave the job and exit 0, then the coordinator.
  for (const std::string& id : all) workers_[id].process->Signal(SIGTERM);
  for (const std::string& id : all) {
    Worker& w = workers_[id];
    EXPECT_TRUE(ExitedZero(w.process->Wait(absl::Seconds(5)))) << id;
    EXPECT_NE(w.process->Log().find("worker=" + id + " left: ok"),
              std::string::npos)
        << id;
    EXPECT_FALSE(std::filesystem::exists(w.socket)) << w.socket;
  }
  coordinator_->Signal(SIGTERM);
  EXPECT_TRUE(ExitedZero(coordinator_->Wait(absl::Seconds(5))));
  for (const std::string& id : all) {
    EXPECT_NE(coordinator_->Log().find(
                  absl::StrCat("job=", kJob, " worker=", id, " left")),
              std::string::npos)
        << id;
  }
}

// Keeps a WatchPlan call open; cancels and finishes it however the test
// ends.
struct PlanWatch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::Plan>> reader;
  ~PlanWatch() {
    if (!reader) return;
    context.TryCancel();
    v1::Plan ignored;
    while (reader->Read(&ignored)) {
    }
    reader->Finish().ok();
  }
};

TEST_F(ControlPlaneTest,
       WatchPlanSendsTheCurrentVersionThenTheNextOnOneStream) {
  ASSERT_NO_FATAL_FAILURE(StartWorker("w0"));
  ASSERT_NO_FATAL_FAILURE(StartWorker("w1"));
  absl::StatusOr<v1::Plan> current = WaitForPlanOf({"w0", "w1"}, kWaitTimeout);
  ASSERT_TRUE(current.ok()) << current.status();

  PlanWatch watch;
  watch.context.set_deadline(Deadline(kWaitTimeout));
  v1::WatchPlanRequest request;
  request.set_job(kJob);
  request.set_worker_id("control-plane-test");
  request.set_known_version(0);
  watch.reader = stub_->WatchPlan(&watch.context, request);
  const absl::Time opened = absl::Now();
  v1::Plan first;
  ASSERT_TRUE(watch.reader->Read(&first));
  // Promptly: it is the current version, not a change to wait for.
  EXPECT_LT(absl::Now() - opened, absl::Seconds(1));
  EXPECT_EQ(first.version(), current->version());
  EXPECT_EQ(WorkersOf(first), (std::set<std::string>{"w0", "w1"}));

  ASSERT_NO_FATAL_FAILURE(StartWorker("w3"));
  v1::Plan next;
  ASSERT_TRUE(watch.reader->Read(&next));
  EXPECT_EQ(next.version(), first.version() + 1);
  EXPECT_EQ(next.reason(), "worker w3 joined");
  ASSERT_NO_FATAL_FAILURE(ExpectCompletePlan(next, {"w0", "w1", "w3"}));

  for (auto& [id, worker] : workers_) worker.process->Signal(SIGTERM);
  for (auto& [id, worker] : workers_) {
    EXPECT_TRUE(ExitedZero(worker.process->Wait(absl::Seconds(5)))) << id;
  }
}

// The worker's local socket is behind the same bearer token as the
// coordinator: every muonps.v1.Worker method (taken from the service
// descriptor) and reflection refuse a caller without it or with a wrong
// one; health answers; with the token GetStatus works.
TEST_F(ControlPlaneTest, WorkerSocketRefusesCallersWithoutTheToken) {
  ASSERT_NO_FATAL_FAILURE(StartWorker("w0"));
  ASSERT_TRUE(WaitForPlanOf({"w0"}, kWaitTimeout).ok());
  const std::string target = "unix:" + workers_.at("w0").socket;
  const std::string wrong = dir_ + "/wrong-token";
  std::ofstream(wrong) << "0123456789abcdef0123456789abcdef\n";
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "muonps.v1.Worker");
  ASSERT_NE(service, nullptr);
  for (const std::string& token_file : {std::string(), wrong}) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        OpenChannel(target, {.token_file = token_file});
    ASSERT_TRUE(channel.ok());
    grpc::GenericStub generic(*channel);
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method =
          absl::StrCat("/muonps.v1.Worker/", service->method(i)->name());
      grpc::ClientContext context;
      context.set_deadline(Deadline(absl::Seconds(5)));
      grpc::Slice empty(std::string{});
      grpc::ByteBuffer request(&empty, 1), response;
      grpc::Status status;
      absl::Notification done;
      generic.UnaryCall(&context, method, grpc::StubOptions(), &request,
                        &response, [&](grpc::Status s) {
                          status = std::move(s);
                          done.Notify();
                        });
      done.WaitForNotification();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " (token file \"" << token_file
          << "\"): " << status.error_message();
    }
    grpc::ClientContext health_context;
    health_context.set_deadline(Deadline(absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse serving;
    EXPECT_TRUE(grpc::health::v1::Health::NewStub(*channel)
                    ->Check(&health_context, {}, &serving)
                    .ok());
  }
  std::unique_ptr<v1::Worker::Stub> stub =
      v1::Worker::NewStub(testing::TestChannel(target));
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(5)));
  v1::WorkerStatus status;
  EXPECT_TRUE(stub->GetStatus(&context, {}, &status).ok());
  EXPECT_EQ(status.worker_id(), "w0");
}

}  // namespace
}  // namespace muonps
