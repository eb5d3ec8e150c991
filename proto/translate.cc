#include "proto/translate.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace proto {
namespace {

// The item a batch member names: "name" (a 2-D matrix) or "name[expert]";
// nullopt if there is no such matrix or expert.
std::optional<scheduler::ItemRef> ItemNamed(
    const std::string& member, const std::map<std::string, int>& index,
    const std::vector<scheduler::MatrixSpec>& matrices) {
  auto m = index.find(member);
  if (m != index.end() && matrices[m->second].experts == 1) {
    return scheduler::ItemRef{m->second, 0};
  }
  const size_t open = member.rfind('[');
  if (open != std::string::npos && member.back() == ']') {
    m = index.find(member.substr(0, open));
    int64_t expert = -1;
    if (m != index.end() && matrices[m->second].experts > 1 &&
        absl::SimpleAtoi(absl::string_view(member).substr(
                             open + 1, member.size() - open - 2),
                         &expert) &&
        expert >= 0 && expert < matrices[m->second].experts) {
      return scheduler::ItemRef{m->second, static_cast<int32_t>(expert)};
    }
  }
  return std::nullopt;
}

}  // namespace

scheduler::Layout LayoutFromProto(v1::Layout layout) {
  switch (layout) {
    case v1::LAYOUT_UNREDUCED:
      return scheduler::Layout::kUnreduced;
    case v1::LAYOUT_ROW_SHARDED:
      return scheduler::Layout::kRowSharded;
    default:
      return scheduler::Layout::kReplicated;
  }
}

DType DTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    default:
      return DType::kFloat32;
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
    case DType::kFloat16:
      return v1::DTYPE_FP16;
    case DType::kFloat32:
      break;
  }
  return v1::DTYPE_FP32;
}

v1::Layout LayoutToProto(scheduler::Layout layout) {
  switch (layout) {
    case scheduler::Layout::kUnreduced:
      return v1::LAYOUT_UNREDUCED;
    case scheduler::Layout::kRowSharded:
      return v1::LAYOUT_ROW_SHARDED;
    case scheduler::Layout::kReplicated:
      break;
  }
  return v1::LAYOUT_REPLICATED;
}

NsAlgorithm NsAlgorithmFromProto(v1::NsAlgorithm algorithm) {
  return algorithm == v1::NS_ALGORITHM_GRAM ? NsAlgorithm::kGram
                                            : NsAlgorithm::kNs5;
}

v1::NsAlgorithm NsAlgorithmToProto(NsAlgorithm algorithm) {
  return algorithm == NsAlgorithm::kGram ? v1::NS_ALGORITHM_GRAM
                                         : v1::NS_ALGORITHM_NS5;
}

namespace {

// MatrixFromProto without its enum checks.
scheduler::MatrixSpec MatrixOf(const v1::Matrix& m) {
  scheduler::MatrixSpec s;
  s.name = m.name();
  s.rows = m.rows();
  s.cols = m.cols();
  // 0 and 1 both mean a plain 2-D matrix; a negative count stays, for the
  // coordinator's range check to name.
  s.experts = m.experts() == 0 ? 1 : m.experts();
  s.layer = m.layer();
  s.dtype = DTypeFromProto(m.dtype());
  s.layout = LayoutFromProto(m.layout());
  s.shard_experts = m.shard_experts();
  return s;
}

}  // namespace

absl::StatusOr<scheduler::MatrixSpec> MatrixFromProto(const v1::Matrix& matrix,
                                                      absl::string_view field) {
  if (!v1::DType_IsValid(matrix.dtype())) {
    return InvalidField(
        absl::StrCat(field, ".dtype"),
        absl::StrCat("unknown dtype ", static_cast<int>(matrix.dtype())));
  }
  if (!v1::Layout_IsValid(matrix.layout())) {
    return InvalidField(
        absl::StrCat(field, ".layout"),
        absl::StrCat("unknown layout ", static_cast<int>(matrix.layout())));
  }
  return MatrixOf(matrix);
}

std::vector<scheduler::MatrixSpec> MatricesFromJob(const v1::JobSpec& job) {
  std::vector<scheduler::MatrixSpec> out;
  out.reserve(job.matrices_size());
  for (const v1::Matrix& m : job.matrices()) out.push_back(MatrixOf(m));
  return out;
}

v1::Matrix MatrixToProto(const scheduler::MatrixSpec& matrix) {
  v1::Matrix out;
  out.set_name(matrix.name);
  out.set_rows(matrix.rows);
  out.set_cols(matrix.cols);
  out.set_experts(matrix.experts);
  out.set_dtype(DTypeToProto(matrix.dtype));
  out.set_layout(LayoutToProto(matrix.layout));
  out.set_layer(matrix.layer);
  out.set_shard_experts(matrix.shard_experts);
  return out;
}

kernels::MuonHyperparameters MuonFromProto(const v1::MuonHyperparameters& h) {
  kernels::MuonHyperparameters out;
  out.lr = h.lr();
  out.weight_decay = h.weight_decay();
  out.momentum = h.has_momentum() ? h.momentum() : 0.95;
  out.nesterov = h.has_nesterov() ? h.nesterov() : true;
  out.lr_adjustment = h.adjust_lr_fn() == v1::LR_ADJUSTMENT_MATCH_RMS_ADAMW
                          ? kernels::LrAdjustment::kMatchRmsAdamW
                          : kernels::LrAdjustment::kOriginal;
  out.ns.steps = h.ns_steps() > 0 ? h.ns_steps() : 5;
  out.ns.polar_express = h.polar_express();
  if (h.ns_eps() > 0) out.ns.eps = h.ns_eps();
  if (h.ns_coefficients_size() == 3) {
    out.ns.coefficients = {h.ns_coefficients(0), h.ns_coefficients(1),
                           h.ns_coefficients(2)};
  }
  return out;
}

absl::StatusOr<scheduler::OwnershipPlan> OwnershipFromPlan(
    const v1::Plan& plan, const std::vector<scheduler::MatrixSpec>& matrices) {
  scheduler::OwnershipPlan out;
  std::map<std::string, int> rank_of;
  for (int r = 0; r < plan.workers_size(); ++r) {
    out.worker_ids.push_back(plan.workers(r));
    rank_of[plan.workers(r)] = r;
  }
  out.dedicated = plan.dedicated_workers();
  std::map<std::string, int> index;
  for (size_t m = 0; m < matrices.size(); ++m) {
    index[matrices[m].name] = static_cast<int>(m);
    out.matrix_names.push_back(matrices[m].name);
  }
  out.owners.resize(matrices.size());
  for (int i = 0; i < plan.matrices_size(); ++i) {
    const v1::MatrixPlacement& p = plan.matrices(i);
    auto m = index.find(p.name());
    if (m == index.end()) {
      return InvalidField(absl::StrCat("plan.matrices[", i, "].name"),
                          absl::StrCat(Quoted(p.name()), " is not in the job"));
    }
    for (int e = 0; e < p.owners_size(); ++e) {
      auto r = rank_of.find(p.owners(e));
      if (r == rank_of.end()) {
        return InvalidField(
            absl::StrCat("plan.matrices[", i, "].owners[", e, "]"),
            absl::StrCat(Quoted(p.owners(e)), " is not a worker of the plan"));
      }
      out.owners[m->second].push_back(r->second);
    }
  }
  for (int g = 0; g < plan.owner_groups_size(); ++g) {
    const v1::OwnerGroup& group = plan.owner_groups(g);
    std::vector<int32_t>& to = out.groups.emplace_back();
    for (int s = 0; s < group.workers_size(); ++s) {
      auto r = rank_of.find(group.workers(s));
      if (r == rank_of.end()) {
        return InvalidField(
            absl::StrCat("plan.owner_groups[", g, "].workers[", s, "]"),
            absl::StrCat(Quoted(group.workers(s)),
                         " is not a worker of the plan"));
      }
      to.push_back(r->second);
    }
  }
  for (int k = 0; k < plan.exchange_nodes_size(); ++k) {
    const v1::NodeWorkers& node = plan.exchange_nodes(k);
    std::vector<int32_t>& to = out.exchange_nodes.emplace_back();
    for (int p = 0; p < node.workers_size(); ++p) {
      auto r = rank_of.find(node.workers(p));
      if (r == rank_of.end()) {
        return InvalidField(
            absl::StrCat("plan.exchange_nodes[", k, "].workers[", p, "]"),
            absl::StrCat(Quoted(node.workers(p)),
                         " is not a worker of the plan"));
      }
      to.push_back(r->second);
    }
  }
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (static_cast<int64_t>(out.owners[m].size()) != matrices[m].experts) {
      return InvalidField(
          "plan.matrices",
          absl::StrCat("matrix ", Quoted(matrices[m].name), " has ",
                       out.owners[m].size(), " owners for ",
                       matrices[m].experts, " experts"));
    }
  }
  for (int b = 0; b < plan.batches_size(); ++b) {
    const v1::Batch& batch = plan.batches(b);
    const std::string field = absl::StrCat("plan.batches[", b, "]");
    auto r = rank_of.find(batch.worker_id());
    if (r == rank_of.end()) {
      return InvalidField(absl::StrCat(field, ".worker_id"),
                          absl::StrCat(Quoted(batch.worker_id()),
                                       " is not a worker of the plan"));
    }
    scheduler::Batch& to = out.batches.emplace_back();
    to.worker = r->second;
    to.rows = batch.rows();
    to.cols = batch.cols();
    to.seconds = batch.predicted_seconds();
    for (int k = 0; k < batch.matrices_size(); ++k) {
      const std::optional<scheduler::ItemRef> item =
          ItemNamed(batch.matrices(k), index, matrices);
      if (!item.has_value()) {
        return InvalidField(absl::StrCat(field, ".matrices[", k, "]"),
                            absl::StrCat(Quoted(batch.matrices(k)),
                                         " is not a matrix or expert of the "
                                         "job"));
      }
      to.items.push_back(*item);
    }
    for (const v1::BatchPart& part : batch.parts()) {
      to.parts.push_back({part.count(), NsAlgorithmFromProto(part.algorithm()),
                          part.predicted_seconds()});
    }
    if (to.parts.empty()) {
      to.parts.push_back({batch.matrices_size(),
                          NsAlgorithmFromProto(batch.algorithm()),
                          batch.predicted_seconds()});
    }
  }
  return out;
}

v1::Batch BatchToProto(const scheduler::Batch& batch,
                       const std::vector<std::string>& worker_ids,
                       const std::vector<scheduler::MatrixSpec>& matrices) {
  v1::Batch out;
  out.set_worker_id(worker_ids[batch.worker]);
  out.set_rows(batch.rows);
  out.set_cols(batch.cols);
  out.set_algorithm(NsAlgorithmToProto(
      batch.parts.empty() ? NsAlgorithm::kNs5 : batch.parts.front().algorithm));
  for (const scheduler::ItemRef& item : batch.items) {
    const scheduler::MatrixSpec& spec = matrices[item.matrix];
    out.add_matrices(spec.experts > 1
                         ? absl::StrCat(spec.name, "[", item.expert, "]")
                         : spec.name);
  }
  out.set_predicted_seconds(batch.seconds);
  for (const scheduler::BatchPart& part : batch.parts) {
    v1::BatchPart* p = out.add_parts();
    p->set_count(part.count);
    p->set_algorithm(NsAlgorithmToProto(part.algorithm));
    p->set_predicted_seconds(part.seconds);
  }
  return out;
}

}  // namespace proto
}  // namespace muonps
