#include "server/coordinator/job_members.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "common/status.h"

namespace muonps {
namespace coordinator {

WorkerRecord* JobMembers::Find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

absl::Status CheckCertificate(const std::string& job,
                              const std::string& worker_id,
                              const WorkerRecord& worker,
                              const std::string& certificate) {
  if (worker.join.certificate.empty() ||
      worker.join.certificate == certificate) {
    return absl::OkStatus();
  }
  return FieldError(
      absl::StatusCode::kPermissionDenied, "worker_id",
      absl::StrCat(Quoted(worker_id), " of job ", Quoted(job),
                   " joined with the client certificate ",
                   worker.join.certificate, "; this call came with ",
                   certificate.empty() ? "none" : certificate));
}

absl::StatusOr<WorkerRecord*> JobMembers::Authenticate(
    const std::string& job, const std::string& worker_id,
    const std::string& worker_token, const std::string& certificate) {
  WorkerRecord* worker = Find(worker_id);
  if (worker == nullptr) {
    return FieldError(
        absl::StatusCode::kNotFound, "worker_id",
        absl::StrCat(Quoted(worker_id), " holds no lease in job ", Quoted(job),
                     " (expired or never joined): join again"));
  }
  if (!SecretsEqual(worker_token, worker->token)) {
    return FieldError(absl::StatusCode::kUnauthenticated, "worker_token",
                      absl::StrCat(worker_token.empty() ? "missing" : "wrong",
                                   ": not the token JoinJob gave worker ",
                                   Quoted(worker_id), " of job ", Quoted(job)));
  }
  MUONPS_RETURN_IF_ERROR(
      CheckCertificate(job, worker_id, *worker, certificate));
  return worker;
}

absl::StatusOr<WorkerRecord*> JobMembers::AuthenticateLease(
    const std::string& job, const std::string& worker_id,
    const std::string& worker_token, const std::string& instance_id,
    const std::string& certificate) {
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      Authenticate(job, worker_id, worker_token, certificate));
  if (worker->join.instance_id != instance_id) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "instance_id",
                      "the lease belongs to another instance of this worker");
  }
  return worker;
}

namespace {

// The one conversion of a member to its stored form.
StoredWorker StoredOf(const std::string& id, const WorkerRecord& worker) {
  StoredWorker stored;
  stored.worker_id = id;
  stored.join = worker.join;
  stored.join_time_ms = absl::ToUnixMillis(worker.join_time);
  stored.token = worker.token;
  stored.join_seq = worker.join_seq;
  stored.draining = worker.draining;
  return stored;
}

}  // namespace

StoreOp JobMembers::Add(const std::string& job, WorkerRecord worker) {
  const std::string id = worker.join.worker_id;
  worker.join_seq = next_join_seq_++;
  worker.generation = ++generation_;
  StoredWorker stored = StoredOf(id, worker);
  workers_[id] = std::move(worker);
  join_order_.push_back(id);
  reasons_.push_back(absl::StrCat("worker ", id, " joined"));
  return store_op::PutWorker{job, std::move(stored)};
}

StoreOp JobMembers::Remove(const std::string& job, const std::string& worker_id,
                           const std::string& reason) {
  workers_.erase(worker_id);
  join_order_.erase(
      std::remove(join_order_.begin(), join_order_.end(), worker_id),
      join_order_.end());
  ++generation_;
  if (!reason.empty()) reasons_.push_back(reason);
  return store_op::DeleteWorker{job, worker_id};
}

bool JobMembers::SetHasTrainer(const std::string& worker_id, bool has_trainer) {
  WorkerRecord& worker = workers_.at(worker_id);
  if (worker.has_trainer == has_trainer) return false;
  worker.has_trainer = has_trainer;
  return true;
}

bool JobMembers::SetTrainerRank(const std::string& worker_id,
                                std::optional<int32_t> trainer_rank) {
  WorkerRecord& worker = workers_.at(worker_id);
  if (!trainer_rank.has_value() || worker.trainer_rank == trainer_rank) {
    return false;
  }
  worker.trainer_rank = trainer_rank;
  return true;
}

void JobMembers::Touch(std::string reason) {
  ++generation_;
  reasons_.push_back(std::move(reason));
}

void JobMembers::SetMeasuredSpeeds(const std::vector<std::string>& ids,
                                   const std::vector<double>& factors,
                                   int64_t version, std::string reason) {
  ++generation_;
  for (size_t i = 0; i < ids.size() && i < factors.size(); ++i) {
    WorkerRecord& worker = workers_.at(ids[i]);
    worker.speed.Set(factors[i], version);
    worker.generation = generation_;
  }
  reasons_.push_back(std::move(reason));
}

StoreOp JobMembers::SetDraining(const std::string& job,
                                const std::string& worker_id, bool draining) {
  WorkerRecord& worker = workers_.at(worker_id);
  worker.draining = draining;
  worker.generation = ++generation_;
  reasons_.push_back(absl::StrCat("worker ", worker_id,
                                  draining ? " draining" : " drain undone"));
  return store_op::PutWorker{job, StoredOf(worker_id, worker)};
}

std::vector<std::string> JobMembers::Expired(absl::Time now) const {
  std::vector<std::string> lost;
  for (const auto& [id, w] : workers_) {
    if (w.lease_expiry <= now) lost.push_back(id);
  }
  return lost;
}

void JobMembers::Restore(const std::string& worker_id, WorkerRecord worker) {
  next_join_seq_ = std::max(next_join_seq_, worker.join_seq + 1);
  workers_[worker_id] = std::move(worker);
  join_order_.push_back(worker_id);
}

void JobMembers::DropReasons(size_t count) {
  reasons_.erase(reasons_.begin(),
                 reasons_.begin() + std::min(count, reasons_.size()));
}

}  // namespace coordinator
}  // namespace muonps
