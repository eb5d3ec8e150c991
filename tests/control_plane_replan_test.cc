// The control plane with real processes on loopback: one muonps-coordinator
// and three muonps-worker daemons. Proves that joining workers get a
// complete ownership plan, that a SIGKILLed worker's lease expires and its
// matrices move to the survivors (and little else moves), that it rejoins
// when restarted, that both binaries serve valid Prometheus text (checked
// by a validator of the format, itself tested here first), and that SIGTERM
// ends every process cleanly.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/control_plane_fixture.h"

namespace muonps {
namespace {

using control_plane_test::ControlPlaneTest;
using control_plane_test::ExitedZero;
using control_plane_test::ExpectCompletePlan;
using control_plane_test::Item;
using control_plane_test::ItemsOf;
using control_plane_test::kHeartbeatMs;
using control_plane_test::kJob;
using control_plane_test::kLeaseTtl;
using control_plane_test::kLeaseTtlMs;
using control_plane_test::kWaitTimeout;
using control_plane_test::kWorkerMemoryBytes;
using control_plane_test::MomentumOf;

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

}  // namespace
}  // namespace muonps
