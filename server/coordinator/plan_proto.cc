#include "server/coordinator/plan_proto.h"

#include "absl/strings/str_cat.h"
#include "proto/translate.h"

namespace muonps {
namespace coordinator {

v1::Plan PlanToProto(const PlanContext& context,
                     const std::vector<scheduler::MatrixSpec>& matrices,
                     const scheduler::OwnershipPlan& plan,
                     const scheduler::StepSchedule& schedule) {
  v1::Plan out;
  out.set_name(absl::StrCat("jobs/", context.job, "/plans/", context.version));
  out.set_job(context.job);
  out.set_version(context.version);
  out.set_reason(context.reason);
  out.set_plan_ms(context.plan_ms);
  for (const std::string& id : plan.worker_ids) out.add_workers(id);
  out.set_dedicated_workers(plan.dedicated);
  std::vector<int32_t> bucket_of(matrices.size(), 0);
  for (size_t b = 0; b < schedule.buckets.size(); ++b) {
    const scheduler::Bucket& bucket = schedule.buckets[b];
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
  for (size_t w = 0; w < plan.worker_ids.size(); ++w) {
    v1::WorkerLoad* load = out.add_loads();
    load->set_worker_id(plan.worker_ids[w]);
    load->set_predicted_seconds(plan.worker_seconds[w]);
    load->set_memory_bytes(plan.worker_memory_bytes[w]);
    load->set_momentum_bytes(plan.worker_momentum_bytes[w]);
    load->set_link_bytes(plan.worker_link_bytes[w]);
  }
  out.set_max_seconds(plan.max_seconds);
  out.set_mean_seconds(plan.mean_seconds);
  out.set_imbalance(plan.imbalance);
  out.set_lower_bound(plan.lower_bound);
  out.set_moved_bytes(plan.moved_bytes);
  return out;
}

}  // namespace coordinator
}  // namespace muonps
