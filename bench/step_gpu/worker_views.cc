#include "bench/step_gpu/worker_views.h"

#include <httplib.h>

#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/common/coordinator_plan.h"
#include "bench/step_gpu/llama_matrices.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace bench {
namespace {

constexpr char kSentMetric[] = "muonps_worker_transport_bytes_sent_total";
constexpr char kReceivedMetric[] =
    "muonps_worker_transport_bytes_received_total";
constexpr char kCallsMetric[] = "muonps_worker_transport_calls_total";
constexpr char kLaunchesMetric[] = "muonps_worker_transport_launches_total";

constexpr char kComputeMetric[] = "muonps_worker_step_compute_seconds";
constexpr char kPredictedMetric[] =
    "muonps_worker_step_compute_predicted_seconds";

}  // namespace

absl::StatusOr<WorkerMetrics> ScrapeWorkerMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_metrics: \"", address, "\" is not HOST:PORT"));
  }
  httplib::Client client(address.substr(0, colon), port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Result got = client.Get("/metrics");
  if (!got) {
    return absl::UnavailableError(absl::StrCat(
        "worker metrics at ", address, ": ", httplib::to_string(got.error())));
  }
  if (got->status != 200) {
    return absl::UnavailableError(absl::StrCat("worker metrics at ", address,
                                               ": HTTP status ", got->status));
  }
  if (got->body.find(absl::StrCat("# TYPE ", kSentMetric)) ==
      std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker metrics at ", address, " have no ", kSentMetric,
                     ": a muonps-worker built before it?"));
  }
  WorkerMetrics bytes;
  for (absl::string_view line : absl::StrSplit(got->body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == absl::string_view::npos ||
        value_at == absl::string_view::npos) {
      continue;
    }
    const absl::string_view name = line.substr(0, name_end);
    if (name != kSentMetric && name != kReceivedMetric &&
        name != kComputeMetric && name != kPredictedMetric &&
        name != kCallsMetric && name != kLaunchesMetric) {
      continue;
    }
    double value = 0;
    if (!absl::SimpleAtod(line.substr(value_at + 1), &value)) {
      return absl::DataLossError(absl::StrCat(
          "worker metrics at ", address, ": unparsable line \"", line, "\""));
    }
    if (name == kComputeMetric) {
      bytes.compute_seconds = value;
      continue;
    }
    if (name == kPredictedMetric) {
      bytes.predicted_seconds = value;
      continue;
    }
    if (name == kReceivedMetric) {
      bytes.received += value;
      continue;
    }
    if (name == kLaunchesMetric) {
      bytes.launches += value;
      continue;
    }
    std::string op = "all";
    if (const size_t at = line.find("op=\""); at != absl::string_view::npos) {
      const size_t end = line.find('"', at + 4);
      op = std::string(line.substr(at + 4, end - at - 4));
    }
    if (name == kCallsMetric) {
      bytes.calls_by_op[op] += value;
      continue;
    }
    bytes.sent += value;
    bytes.sent_by_op[op] += value;
  }
  return bytes;
}

absl::StatusOr<WorkerMetrics> ScrapeWorkerMetricsSettled(
    const std::string& address) {
  MUONPS_ASSIGN_OR_RETURN(WorkerMetrics last, ScrapeWorkerMetrics(address));
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    MUONPS_ASSIGN_OR_RETURN(WorkerMetrics now, ScrapeWorkerMetrics(address));
    if (now.sent == last.sent && now.received == last.received) return now;
    last = std::move(now);
  }
  return last;
}

absl::Status PrintPlan(const std::string& coordinator, const std::string& job,
                       const std::string& layout, int ranks) {
  MUONPS_ASSIGN_OR_RETURN(const v1::Plan plan, FetchPlan(coordinator, job));
  for (int w = 0; w < plan.workers_size(); ++w) {
    const std::string& id = plan.workers(w);
    double predicted = -1;
    for (const v1::WorkerLoad& load : plan.loads()) {
      if (load.worker_id() == id) predicted = load.predicted_seconds();
    }
    nlohmann::json batches = nlohmann::json::array();
    for (const v1::Batch& b : plan.batches()) {
      if (b.worker_id() != id) continue;
      nlohmann::json parts = nlohmann::json::array();
      for (const v1::BatchPart& p : b.parts()) {
        parts.push_back({{"count", p.count()},
                         {"algorithm", v1::NsAlgorithm_Name(p.algorithm())},
                         {"predicted_ms", p.predicted_seconds() * 1e3}});
      }
      batches.push_back({{"shape", absl::StrCat(b.rows(), "x", b.cols())},
                         {"count", b.matrices_size()},
                         {"parts", parts},
                         {"predicted_ms", b.predicted_seconds() * 1e3}});
    }
    PrintLine({{"what", "muonps_plan_worker"},
               {"worker", w},
               {"worker_id", id},
               {"layout", layout},
               {"ranks", ranks},
               {"plan_version", plan.version()},
               {"predicted_ms", predicted >= 0 ? nlohmann::json(predicted * 1e3)
                                               : nlohmann::json()},
               {"batches", batches}});
  }
  return absl::OkStatus();
}

}  // namespace bench
}  // namespace muonps
