#include "server/coordinator/request_validation.h"

#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace coordinator {
namespace {

absl::Status InRange(int64_t value, int64_t lo, int64_t hi,
                     absl::string_view field) {
  if (value < lo || value > hi) {
    return InvalidField(field,
                        absl::StrCat(value, " is not in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status NonNegativeFinite(double value, absl::string_view field) {
  if (!std::isfinite(value) || value < 0) {
    return InvalidField(field, absl::StrCat(value, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMuon(const MuonSettings& h) {
  MUONPS_RETURN_IF_ERROR(NonNegativeFinite(h.lr, "job.muon.lr"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(h.weight_decay, "job.muon.weight_decay"));
  if (h.momentum.has_value() &&
      (!std::isfinite(*h.momentum) || *h.momentum < 0 || *h.momentum >= 1)) {
    return InvalidField("job.muon.momentum",
                        absl::StrCat(*h.momentum, " is not in [0, 1)"));
  }
  MUONPS_RETURN_IF_ERROR(InRange(h.ns_steps, 0, 100, "job.muon.ns_steps"));
  MUONPS_RETURN_IF_ERROR(NonNegativeFinite(h.ns_eps, "job.muon.ns_eps"));
  if (!h.ns_coefficients.empty() && h.ns_coefficients.size() != 3) {
    return InvalidField("job.muon.ns_coefficients",
                        absl::StrCat("has ", h.ns_coefficients.size(),
                                     " values; expected none or 3 (a, b, c)"));
  }
  for (double c : h.ns_coefficients) {
    if (!std::isfinite(c)) {
      return InvalidField("job.muon.ns_coefficients",
                          absl::StrCat(c, " is not finite"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAdamW(const AdamWSettings& h) {
  MUONPS_RETURN_IF_ERROR(NonNegativeFinite(h.lr, "job.adamw.lr"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(h.weight_decay, "job.adamw.weight_decay"));
  MUONPS_RETURN_IF_ERROR(NonNegativeFinite(h.eps, "job.adamw.eps"));
  for (const auto& [value, field] :
       {std::pair<double, const char*>{h.beta1, "job.adamw.beta1"},
        {h.beta2, "job.adamw.beta2"}}) {
    if (!std::isfinite(value) || value < 0 || value >= 1) {
      return InvalidField(field, absl::StrCat(value, " is not in [0, 1)"));
    }
  }
  return absl::OkStatus();
}

// HSDP's replica groups: the trainers split into groups of one size, each
// trainer's worker in its group, every group holding the same gradients.
absl::Status ValidateReplicas(const JobSpec& spec) {
  if (spec.replicas < 0) {
    return InvalidField("job.replicas", absl::StrCat(spec.replicas, " is < 0"));
  }
  if (spec.replicas <= 1) return absl::OkStatus();
  if (spec.trainers <= 0 || spec.trainers % spec.replicas != 0) {
    return InvalidField("job.replicas",
                        absl::StrCat(spec.replicas,
                                     " replica groups need job.trainers set to "
                                     "a multiple of them, got ",
                                     spec.trainers));
  }
  if (spec.dedicated_workers > 0) {
    return InvalidField(
        "job.replicas",
        absl::StrCat("replica groups take no dedicated workers; "
                     "job.dedicated_workers is ",
                     spec.dedicated_workers));
  }
  for (size_t i = 0; i < spec.matrices.size(); ++i) {
    const scheduler::MatrixSpec& m = spec.matrices[i];
    if (m.layout != scheduler::Layout::kUnreduced) continue;
    return InvalidField(
        "job.replicas",
        absl::StrCat("replica groups need every gradient reduced; "
                     "job.matrices[",
                     i, "] ", Quoted(m.name), " is unreduced"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateId(absl::string_view value, absl::string_view field) {
  if (value.empty() || value.size() > 128) {
    return InvalidField(
        field, absl::StrCat("must be 1..128 bytes, got ", value.size()));
  }
  for (char c : value) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return InvalidField(
          field, absl::StrCat(Quoted(value), " may hold only [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec, const Limits& limits) {
  MUONPS_RETURN_IF_ERROR(ValidateId(spec.name, "job.name"));
  if (spec.matrices.empty()) {
    return InvalidField("job.matrices", "is empty");
  }
  if (static_cast<int64_t>(spec.matrices.size()) >
      limits.max_matrices_per_job) {
    return FieldError(
        absl::StatusCode::kResourceExhausted, "job.matrices",
        absl::StrCat(spec.matrices.size(), " exceed the limit of ",
                     limits.max_matrices_per_job));
  }
  MUONPS_RETURN_IF_ERROR(ValidateMuon(spec.muon));
  MUONPS_RETURN_IF_ERROR(ValidateAdamW(spec.adamw));
  MUONPS_RETURN_IF_ERROR(
      InRange(spec.bucket_bytes, 0, int64_t{1} << 40, "job.bucket_bytes"));
  MUONPS_RETURN_IF_ERROR(
      InRange(spec.dedicated_workers, 0, 1024, "job.dedicated_workers"));
  MUONPS_RETURN_IF_ERROR(InRange(spec.trainers, 0, 1024, "job.trainers"));
  MUONPS_RETURN_IF_ERROR(ValidateReplicas(spec));
  MUONPS_RETURN_IF_ERROR(InRange(spec.checkpoint_every, 0, int64_t{1} << 40,
                                 "job.checkpoint_every"));
  if (!spec.checkpoint_dir.empty() &&
      (spec.checkpoint_dir[0] != '/' || spec.checkpoint_dir.size() > 4096 ||
       spec.checkpoint_dir.find('\0') != std::string::npos)) {
    return InvalidField("job.checkpoint_dir",
                        "must be an absolute path of at most 4096 bytes");
  }
  if (spec.checkpoint_dir.empty() && spec.checkpoint_every > 0) {
    return InvalidField("job.checkpoint_every", "needs job.checkpoint_dir");
  }
  int64_t items = 0;
  int64_t parameters = 0;
  std::set<absl::string_view> names;
  for (size_t i = 0; i < spec.matrices.size(); ++i) {
    const scheduler::MatrixSpec& m = spec.matrices[i];
    const std::string field = absl::StrCat("job.matrices[", i, "]");
    if (m.name.empty() ||
        static_cast<int64_t>(m.name.size()) > limits.max_name_bytes) {
      return InvalidField(field + ".name",
                          absl::StrCat("must be 1..", limits.max_name_bytes,
                                       " bytes, got ", m.name.size()));
    }
    for (unsigned char c : m.name) {
      if (c < 0x20 || c == 0x7f) {
        return InvalidField(field + ".name", "holds a control character");
      }
    }
    if (!names.insert(m.name).second) {
      return InvalidField(field + ".name",
                          absl::StrCat(Quoted(m.name), " appears twice"));
    }
    MUONPS_RETURN_IF_ERROR(InRange(m.rows, 1, limits.max_dim, field + ".rows"));
    MUONPS_RETURN_IF_ERROR(InRange(m.cols, 1, limits.max_dim, field + ".cols"));
    // The declaration's 0 (a 2-D matrix) is 1 here.
    MUONPS_RETURN_IF_ERROR(
        InRange(m.experts, 0, limits.max_experts, field + ".experts"));
    MUONPS_RETURN_IF_ERROR(InRange(m.layer, 0, 1 << 20, field + ".layer"));
    if (m.shard_experts && m.layout != scheduler::Layout::kRowSharded) {
      return InvalidField(
          field + ".shard_experts",
          absl::StrCat("splits the experts of a row_sharded stack; ",
                       Quoted(m.name), " is ",
                       scheduler::LayoutName(m.layout)));
    }
    // Each factor is bounded above, so the products cannot overflow; the
    // sums stop at their limits.
    items += m.experts;
    parameters += m.rows * m.cols * m.experts;
    if (items > limits.max_matrices_per_job) {
      return FieldError(
          absl::StatusCode::kResourceExhausted, "job.matrices",
          absl::StrCat("hold more than ", limits.max_matrices_per_job,
                       " matrices (experts counted)"));
    }
    if (parameters > limits.max_parameters_per_job) {
      return FieldError(
          absl::StatusCode::kResourceExhausted, "job.matrices",
          absl::StrCat("hold more than ", limits.max_parameters_per_job,
                       " parameters"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCreateJob(absl::string_view request_id,
                               const JobSpec& spec, const Limits& limits) {
  if (static_cast<int64_t>(request_id.size()) > limits.max_request_id_bytes) {
    return InvalidField("request_id",
                        absl::StrCat("must be at most ",
                                     limits.max_request_id_bytes, " bytes"));
  }
  return ValidateJobSpec(spec, limits);
}

absl::Status ValidateJoinJob(const JoinRequest& request, const Limits& limits) {
  MUONPS_RETURN_IF_ERROR(ValidateId(request.job, "job"));
  MUONPS_RETURN_IF_ERROR(ValidateId(request.worker_id, "worker_id"));
  if (request.instance_id.empty() || request.instance_id.size() > 128) {
    return InvalidField("instance_id", "must be 1..128 bytes");
  }
  const WorkerDevice& d = request.device;
  if (d.memory_bytes <= 0) {
    return InvalidField("device.memory_bytes",
                        absl::StrCat(d.memory_bytes, " must be > 0"));
  }
  if (d.kind != "cuda" && d.kind != "cpu") {
    return InvalidField("device.kind",
                        absl::StrCat(Quoted(d.kind), " is not cuda or cpu"));
  }
  if (d.index < 0) {
    return InvalidField("device.index", absl::StrCat(d.index, " is < 0"));
  }
  if (!std::isfinite(request.speed) || request.speed < 0) {
    return InvalidField(
        "speed", absl::StrCat(request.speed, " must be finite and >= 0"));
  }
  if (static_cast<int64_t>(request.cost_table.size()) >
      limits.max_cost_table_bytes) {
    return FieldError(
        absl::StatusCode::kResourceExhausted, "cost_table",
        absl::StrCat(request.cost_table.size(), " bytes exceed the limit of ",
                     limits.max_cost_table_bytes));
  }
  if (request.data_address.size() > 256) {
    return InvalidField("data_address", "must be at most 256 bytes");
  }
  if (request.device.node.size() > 256) {
    return InvalidField("device.node", "must be at most 256 bytes");
  }
  if (!std::isfinite(request.device.network_gbs) ||
      request.device.network_gbs < 0) {
    return InvalidField(
        "device.network_gbs",
        absl::StrCat(request.device.network_gbs, ": must be finite and >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace coordinator
}  // namespace muonps
