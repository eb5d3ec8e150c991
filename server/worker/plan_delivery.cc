#include "server/worker/plan_delivery.h"

#include <utility>

#include "server/worker/backoff.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

PlanDelivery::PlanDelivery(std::string who, Deliver deliver, Taken taken)
    : who_(std::move(who)),
      deliver_(std::move(deliver)),
      taken_(std::move(taken)),
      thread_([this] { Loop(); }) {}

PlanDelivery::~PlanDelivery() { Stop(); }

void PlanDelivery::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PlanDelivery::Arrived(v1::Plan plan, int64_t epoch) {
  absl::MutexLock lock(&mu_);
  waiting_ = std::move(plan);
  waiting_epoch_ = epoch;
  ++arrivals_;
  refused_ = absl::OkStatus();
}

std::optional<PlanDelivery::Refusal> PlanDelivery::Refused() const {
  absl::MutexLock lock(&mu_);
  if (!waiting_.has_value() || refused_.ok()) return std::nullopt;
  return Refusal{waiting_->version(), refused_};
}

void PlanDelivery::Loop() {
  Backoff backoff;
  int64_t failures = 0;
  while (true) {
    v1::Plan plan;
    int64_t epoch = 0, arrival = 0;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || waiting_.has_value();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      plan = *waiting_;
      epoch = waiting_epoch_;
      arrival = arrivals_;
    }
    const absl::Status delivered = deliver_(plan);
    if (delivered.ok()) {
      if (failures > 0) {
        spdlog::info("{} took plan_version={} after {} failed tries", who_,
                     plan.version(), failures);
      }
      failures = 0;
      backoff.Reset();
      {
        absl::MutexLock lock(&mu_);
        if (arrivals_ == arrival) waiting_.reset();
      }
      taken_(plan, epoch);
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (arrivals_ != arrival) continue;  // a newer one: try it at once
    refused_ = delivered;
    // Said at once, then every tenth try while it keeps failing.
    if (failures++ % 10 == 0) {
      spdlog::error(
          "{} cannot take plan_version={} (steps are refused until it can; "
          "retrying): {}",
          who_, plan.version(), delivered.ToString());
    }
    const auto moved = [this, arrival]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || arrivals_ != arrival;
    };
    mu_.AwaitWithTimeout(absl::Condition(&moved), backoff.Next());
  }
}

}  // namespace worker
}  // namespace muonps
