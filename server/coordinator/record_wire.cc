#include "server/coordinator/record_wire.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/translate.h"

namespace muonps {
namespace coordinator {
namespace {

absl::StatusOr<MuonSettings> MuonFromProto(const v1::MuonHyperparameters& h) {
  MuonSettings out;
  out.lr = h.lr();
  out.weight_decay = h.weight_decay();
  if (h.has_momentum()) out.momentum = h.momentum();
  if (h.has_nesterov()) out.nesterov = h.nesterov();
  out.ns_steps = h.ns_steps();
  switch (h.adjust_lr_fn()) {
    case v1::LR_ADJUSTMENT_UNSPECIFIED:
      break;
    case v1::LR_ADJUSTMENT_ORIGINAL:
      out.lr_adjustment = kernels::LrAdjustment::kOriginal;
      break;
    case v1::LR_ADJUSTMENT_MATCH_RMS_ADAMW:
      out.lr_adjustment = kernels::LrAdjustment::kMatchRmsAdamW;
      break;
    default:
      return InvalidField("job.muon.adjust_lr_fn", "unknown value");
  }
  switch (h.ns_algorithm()) {
    case v1::NS_ALGORITHM_UNSPECIFIED:
      break;
    case v1::NS_ALGORITHM_AUTO:
      out.ns_algorithm = scheduler::AlgorithmPolicy::kAuto;
      break;
    case v1::NS_ALGORITHM_NS5:
      out.ns_algorithm = scheduler::AlgorithmPolicy::kNs5;
      break;
    case v1::NS_ALGORITHM_GRAM:
      out.ns_algorithm = scheduler::AlgorithmPolicy::kGram;
      break;
    default:
      return InvalidField("job.muon.ns_algorithm", "unknown value");
  }
  out.polar_express = h.polar_express();
  out.ns_eps = h.ns_eps();
  out.ns_coefficients.assign(h.ns_coefficients().begin(),
                             h.ns_coefficients().end());
  return out;
}

v1::NsAlgorithm NsAlgorithmToProto(scheduler::AlgorithmPolicy policy) {
  switch (policy) {
    case scheduler::AlgorithmPolicy::kNs5:
      return v1::NS_ALGORITHM_NS5;
    case scheduler::AlgorithmPolicy::kGram:
      return v1::NS_ALGORITHM_GRAM;
    case scheduler::AlgorithmPolicy::kAuto:
      break;
  }
  return v1::NS_ALGORITHM_AUTO;
}

// An empty `muon` message reads back as none.
void MuonToProto(const MuonSettings& h, v1::JobSpec* spec) {
  v1::MuonHyperparameters out;
  out.set_lr(h.lr);
  out.set_weight_decay(h.weight_decay);
  if (h.momentum.has_value()) out.set_momentum(*h.momentum);
  if (h.nesterov.has_value()) out.set_nesterov(*h.nesterov);
  out.set_ns_steps(h.ns_steps);
  if (h.lr_adjustment.has_value()) {
    out.set_adjust_lr_fn(*h.lr_adjustment ==
                                 kernels::LrAdjustment::kMatchRmsAdamW
                             ? v1::LR_ADJUSTMENT_MATCH_RMS_ADAMW
                             : v1::LR_ADJUSTMENT_ORIGINAL);
  }
  if (h.ns_algorithm.has_value()) {
    out.set_ns_algorithm(NsAlgorithmToProto(*h.ns_algorithm));
  }
  out.set_polar_express(h.polar_express);
  out.set_ns_eps(h.ns_eps);
  for (double c : h.ns_coefficients) out.add_ns_coefficients(c);
  if (out.ByteSizeLong() > 0) *spec->mutable_muon() = std::move(out);
}

// An empty `adamw` message reads back as none.
void AdamWToProto(const AdamWSettings& h, v1::JobSpec* spec) {
  v1::AdamWHyperparameters out;
  out.set_lr(h.lr);
  out.set_beta1(h.beta1);
  out.set_beta2(h.beta2);
  out.set_eps(h.eps);
  out.set_weight_decay(h.weight_decay);
  if (out.ByteSizeLong() > 0) *spec->mutable_adamw() = std::move(out);
}

}  // namespace

absl::StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& spec) {
  JobSpec out;
  out.name = spec.name();
  out.matrices.reserve(spec.matrices_size());
  out.unset.reserve(spec.matrices_size());
  for (int i = 0; i < spec.matrices_size(); ++i) {
    const v1::Matrix& m = spec.matrices(i);
    MUONPS_ASSIGN_OR_RETURN(
        scheduler::MatrixSpec matrix,
        proto::MatrixFromProto(m, absl::StrCat("job.matrices[", i, "]")));
    out.matrices.push_back(std::move(matrix));
    out.unset.push_back({.experts = m.experts() == 0,
                         .dtype = m.dtype() == v1::DTYPE_UNSPECIFIED,
                         .layout = m.layout() == v1::LAYOUT_UNSPECIFIED});
  }
  MUONPS_ASSIGN_OR_RETURN(out.muon, MuonFromProto(spec.muon()));
  const v1::AdamWHyperparameters& a = spec.adamw();
  out.adamw = {a.lr(), a.beta1(), a.beta2(), a.eps(), a.weight_decay()};
  out.bucket_bytes = spec.bucket_bytes();
  out.dedicated_workers = spec.dedicated_workers();
  out.trainers = spec.trainers();
  out.replicas = spec.replicas();
  out.allow_momentum_reset = spec.allow_momentum_reset();
  out.checkpoint_dir = spec.checkpoint_dir();
  out.checkpoint_every = spec.checkpoint_every();
  return out;
}

v1::JobSpec JobSpecToProto(const JobSpec& spec) {
  v1::JobSpec out;
  out.set_name(spec.name);
  for (size_t i = 0; i < spec.matrices.size(); ++i) {
    v1::Matrix* m = out.add_matrices();
    *m = proto::MatrixToProto(spec.matrices[i]);
    if (i < spec.unset.size()) {
      const UnsetMatrixFields& unset = spec.unset[i];
      if (unset.experts) m->clear_experts();
      if (unset.dtype) m->clear_dtype();
      if (unset.layout) m->clear_layout();
    }
  }
  MuonToProto(spec.muon, &out);
  AdamWToProto(spec.adamw, &out);
  out.set_bucket_bytes(spec.bucket_bytes);
  out.set_dedicated_workers(spec.dedicated_workers);
  out.set_trainers(spec.trainers);
  out.set_replicas(spec.replicas);
  out.set_allow_momentum_reset(spec.allow_momentum_reset);
  out.set_checkpoint_dir(spec.checkpoint_dir);
  out.set_checkpoint_every(spec.checkpoint_every);
  return out;
}

v1::Device DeviceToProto(const WorkerDevice& d) {
  v1::Device out;
  out.set_host(d.host);
  out.set_kind(d.kind);
  out.set_name(d.name);
  out.set_index(d.index);
  out.set_uuid(d.uuid);
  out.set_memory_bytes(d.memory_bytes);
  out.set_colocated(d.colocated);
  out.set_node(d.node);
  out.set_network_gbs(d.network_gbs);
  return out;
}

WorkerDevice DeviceFromProto(const v1::Device& d) {
  WorkerDevice out;
  out.host = d.host();
  out.node = d.node();
  out.network_gbs = d.network_gbs();
  out.kind = d.kind();
  out.name = d.name();
  out.index = d.index();
  out.uuid = d.uuid();
  out.memory_bytes = d.memory_bytes();
  out.colocated = d.colocated();
  return out;
}

JoinRequest JoinRequestFromProto(const v1::JoinJobRequest& r) {
  JoinRequest out;
  out.job = r.job();
  out.worker_id = r.worker_id();
  out.instance_id = r.instance_id();
  out.device = DeviceFromProto(r.device());
  out.cost_table = r.cost_table();
  out.speed = r.speed();
  out.data_address = r.data_address();
  out.dedicated = r.dedicated();
  return out;
}

v1::JoinJobRequest JoinRequestToProto(const JoinRequest& r) {
  v1::JoinJobRequest out;
  out.set_job(r.job);
  out.set_worker_id(r.worker_id);
  out.set_instance_id(r.instance_id);
  *out.mutable_device() = DeviceToProto(r.device);
  out.set_cost_table(r.cost_table);
  out.set_speed(r.speed);
  out.set_data_address(r.data_address);
  out.set_dedicated(r.dedicated);
  return out;
}

v1::Plan PlanToProto(const PublishedPlan& published) {
  const std::vector<scheduler::MatrixSpec>& matrices = *published.matrices;
  const scheduler::OwnershipPlan& plan = published.ownership;
  v1::Plan out;
  out.set_name(
      absl::StrCat("jobs/", published.job, "/plans/", published.version));
  out.set_job(published.job);
  out.set_version(published.version);
  out.set_reason(published.reason);
  out.set_plan_ms(published.plan_ms);
  for (const std::string& id : plan.worker_ids) out.add_workers(id);
  out.set_dedicated_workers(plan.dedicated);
  std::vector<int32_t> bucket_of(matrices.size(), 0);
  for (size_t b = 0; b < published.buckets.size(); ++b) {
    const PlanBucket& bucket = published.buckets[b];
    v1::Bucket* proto = out.add_buckets();
    for (int32_t m : bucket.matrices) {
      proto->add_matrices(matrices[m].name);
      bucket_of[m] = static_cast<int32_t>(b);
    }
    proto->set_first_layer(bucket.first_layer);
    proto->set_last_layer(bucket.last_layer);
    proto->set_bytes(bucket.bytes);
  }
  for (size_t m = 0; m < matrices.size(); ++m) {
    v1::MatrixPlacement* placement = out.add_matrices();
    placement->set_name(matrices[m].name);
    placement->set_rows(matrices[m].rows);
    placement->set_cols(matrices[m].cols);
    placement->set_bucket(bucket_of[m]);
    for (int32_t owner : plan.owners[m]) {
      placement->add_owners(plan.worker_ids[owner]);
    }
  }
  for (const scheduler::Batch& batch : plan.batches) {
    *out.add_batches() = proto::BatchToProto(batch, plan.worker_ids, matrices);
  }
  for (const std::vector<int32_t>& group : plan.groups) {
    v1::OwnerGroup* to = out.add_owner_groups();
    for (const int32_t rank : group) to->add_workers(plan.worker_ids[rank]);
  }
  for (const std::vector<int32_t>& node : plan.exchange_nodes) {
    v1::NodeWorkers* to = out.add_exchange_nodes();
    for (const int32_t rank : node) to->add_workers(plan.worker_ids[rank]);
  }
  for (size_t w = 0; w < plan.worker_ids.size(); ++w) {
    v1::WorkerLoad* load = out.add_loads();
    load->set_worker_id(plan.worker_ids[w]);
    load->set_predicted_seconds(plan.worker_seconds[w]);
    load->set_memory_bytes(plan.worker_memory_bytes[w]);
    load->set_momentum_bytes(plan.worker_momentum_bytes[w]);
    load->set_link_bytes(plan.worker_link_bytes[w]);
    if (published.trainer_shards.known()) {
      load->set_trainer_shard(published.trainer_shards.shard_of[w]);
    }
  }
  if (published.trainer_shards.known()) {
    out.set_trainer_shards(published.trainer_shards.shards);
  }
  out.set_max_seconds(plan.max_seconds);
  out.set_mean_seconds(plan.mean_seconds);
  out.set_imbalance(plan.imbalance);
  out.set_lower_bound(plan.lower_bound);
  out.set_moved_bytes(plan.moved_bytes);
  out.set_bucket_bytes(published.bucket_bytes);
  out.set_nodes(published.nodes);
  out.set_network_gbs(published.network_gbs);
  out.set_apply_at_commit(published.apply_at_commit);
  return out;
}

absl::StatusOr<std::shared_ptr<const PublishedPlan>> PlanFromProto(
    const v1::Plan& plan,
    std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices) {
  auto out = std::make_shared<PublishedPlan>();
  MUONPS_ASSIGN_OR_RETURN(out->ownership,
                          proto::OwnershipFromPlan(plan, *matrices));
  scheduler::OwnershipPlan& ownership = out->ownership;
  const size_t workers = ownership.worker_ids.size();
  std::map<std::string, size_t> rank_of;
  for (size_t r = 0; r < workers; ++r) rank_of[ownership.worker_ids[r]] = r;
  ownership.worker_seconds.assign(workers, 0);
  ownership.worker_memory_bytes.assign(workers, 0);
  ownership.worker_momentum_bytes.assign(workers, 0);
  ownership.worker_link_bytes.assign(workers, 0);
  if (plan.trainer_shards() < 0) {
    return InvalidField("plan.trainer_shards",
                        absl::StrCat(plan.trainer_shards(), " < 0"));
  }
  scheduler::TrainerShards& shards = out->trainer_shards;
  if (plan.trainer_shards() > 0) {
    shards.shards = plan.trainer_shards();
    shards.shard_of.assign(workers, -1);
  }
  for (int i = 0; i < plan.loads_size(); ++i) {
    const v1::WorkerLoad& load = plan.loads(i);
    auto r = rank_of.find(load.worker_id());
    if (r == rank_of.end()) {
      return InvalidField(absl::StrCat("plan.loads[", i, "].worker_id"),
                          absl::StrCat(Quoted(load.worker_id()),
                                       " is not a worker of the plan"));
    }
    if (shards.shards > 0) {
      if (load.trainer_shard() < -1 || load.trainer_shard() >= shards.shards) {
        return InvalidField(
            absl::StrCat("plan.loads[", i, "].trainer_shard"),
            absl::StrCat(load.trainer_shard(), " is not in [-1, ",
                         shards.shards, ")"));
      }
      shards.shard_of[r->second] = load.trainer_shard();
    }
    ownership.worker_seconds[r->second] = load.predicted_seconds();
    ownership.worker_memory_bytes[r->second] = load.memory_bytes();
    ownership.worker_momentum_bytes[r->second] = load.momentum_bytes();
    ownership.worker_link_bytes[r->second] = load.link_bytes();
  }
  ownership.max_seconds = plan.max_seconds();
  ownership.mean_seconds = plan.mean_seconds();
  ownership.imbalance = plan.imbalance();
  ownership.lower_bound = plan.lower_bound();
  ownership.moved_bytes = plan.moved_bytes();
  std::map<std::string, int32_t> index;
  for (size_t m = 0; m < matrices->size(); ++m) {
    index[(*matrices)[m].name] = static_cast<int32_t>(m);
  }
  for (int b = 0; b < plan.buckets_size(); ++b) {
    const v1::Bucket& bucket = plan.buckets(b);
    PlanBucket& to = out->buckets.emplace_back();
    for (int k = 0; k < bucket.matrices_size(); ++k) {
      auto m = index.find(bucket.matrices(k));
      if (m == index.end()) {
        return InvalidField(
            absl::StrCat("plan.buckets[", b, "].matrices[", k, "]"),
            absl::StrCat(Quoted(bucket.matrices(k)), " is not in the job"));
      }
      to.matrices.push_back(m->second);
    }
    to.first_layer = bucket.first_layer();
    to.last_layer = bucket.last_layer();
    to.bytes = bucket.bytes();
  }
  out->job = plan.job();
  out->version = plan.version();
  out->reason = plan.reason();
  out->plan_ms = plan.plan_ms();
  out->bucket_bytes = plan.bucket_bytes();
  out->nodes = plan.nodes();
  out->network_gbs = plan.network_gbs();
  out->apply_at_commit = plan.apply_at_commit();
  out->matrices = std::move(matrices);
  return out;
}

v1::WorkerStepStats StepStatsToProto(const StepStats& stats) {
  v1::WorkerStepStats out;
  out.set_step(stats.step);
  out.set_plan_version(stats.plan_version);
  out.set_step_seconds(stats.step_seconds);
  out.set_ns_seconds(stats.ns_seconds);
  out.set_predicted_ns_seconds(stats.predicted_ns_seconds);
  out.set_bytes_moved(stats.bytes_moved);
  return out;
}

}  // namespace coordinator
}  // namespace muonps
