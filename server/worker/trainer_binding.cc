#include "server/worker/trainer_binding.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "server/worker/step_protocol.h"

namespace muonps {
namespace worker {
namespace {

// a * b * c, or -1 past kMaxLentElements (or overflowing).
int64_t BoundedProduct(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &ab) ||
      __builtin_mul_overflow(ab, c, &abc) || abc > kMaxLentElements) {
    return -1;
  }
  return abc;
}

// A tensor that is not a job matrix (the client steps it with AdamW): named
// once, not as a job matrix, of a size every offset computed from stays
// far from overflowing, replicated or unreduced.
absl::Status CheckAdamWBinding(const TensorBinding& t,
                               const std::set<std::string>& matrices,
                               std::set<std::string>* seen) {
  const std::string field = absl::StrCat("tensor ", Quoted(t.name));
  if (t.name.empty()) return InvalidField("tensor name", "is empty");
  if (matrices.count(t.name) != 0) {
    return InvalidField(field, "is a matrix of the job: bind it with muon");
  }
  if (!seen->insert(t.name).second) {
    return InvalidField(field, "is bound twice");
  }
  if (t.elements < 1 || t.elements > kMaxLentElements) {
    return InvalidField(
        absl::StrCat(field, ".elements"),
        absl::StrCat(t.elements, " is outside [1, ", kMaxLentElements, "]"));
  }
  if (t.param_elements != 0 && t.param_elements != t.elements) {
    return InvalidField(
        absl::StrCat(field, ".param_elements"),
        absl::StrCat(t.param_elements, " is neither 0 nor ", t.elements));
  }
  if (t.layout != scheduler::Layout::kReplicated &&
      t.layout != scheduler::Layout::kUnreduced) {
    return InvalidField(absl::StrCat(field, ".layout"),
                        absl::StrCat(scheduler::LayoutName(t.layout),
                                     ": an AdamW tensor is replicated or "
                                     "unreduced"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttachedTrainer> BindTrainer(
    const AttachRequest& request,
    const std::vector<scheduler::MatrixSpec>& matrices, int replicas,
    TrainerBuffers& buffers) {
  std::map<std::string, int> index;
  std::set<std::string> names, adamw_names;
  for (size_t m = 0; m < matrices.size(); ++m) {
    index[matrices[m].name] = static_cast<int>(m);
    names.insert(matrices[m].name);
  }
  if (replicas > 1 && request.trainer_count % replicas != 0) {
    return InvalidField(
        "trainer_count",
        absl::StrCat(request.trainer_count, " trainers do not form the job's ",
                     replicas, " replica groups (JobSpec.replicas)"));
  }
  AttachedTrainer trainer;
  trainer.rank = request.trainer_rank;
  trainer.count = request.trainer_count;
  trainer.matrices.resize(matrices.size());
  trainer.bound_position.resize(matrices.size());
  int bound_count = 0;
  std::vector<bool> bound(matrices.size(), false);
  for (const TensorBinding& t : request.tensors) {
    const std::string field = absl::StrCat("tensor ", Quoted(t.name));
    Binding b;
    b.elements = t.elements;
    b.group = t.group;
    if (!t.muon) {
      MUONPS_RETURN_IF_ERROR(CheckAdamWBinding(t, names, &adamw_names));
      b.param_elements = t.elements;
      MUONPS_ASSIGN_OR_RETURN(const LentTensor lent,
                              buffers.Map(t, t.elements, t.elements));
      b.Lend(lent);
      b.layout = t.layout;
      trainer.adamw.emplace_back(t.name, b);
      continue;
    }
    auto it = index.find(t.name);
    if (it == index.end()) {
      return InvalidField(field, "is not a matrix of the job");
    }
    const scheduler::MatrixSpec& spec = matrices[it->second];
    const int64_t full = BoundedProduct(spec.rows, spec.cols, spec.experts);
    if (full < 0) {
      return InvalidField(field, absl::StrCat("the job's shape is larger than ",
                                              kMaxLentElements, " elements"));
    }
    int64_t expected = full;
    if (spec.layout == scheduler::Layout::kRowSharded) {
      const int shards = replicas > 1 ? request.trainer_count / replicas
                                      : request.trainer_count;
      expected = ShardRows(spec.rows, spec.experts, spec.shard_experts,
                           request.trainer_rank % shards, shards) *
                 spec.cols;
    }
    if (t.elements != expected || bound[it->second]) {
      return InvalidField(
          field, absl::StrCat("binds ", t.elements, " elements; the job needs ",
                              expected, ", once"));
    }
    const int64_t param_elements =
        t.param_elements > 0 ? t.param_elements : t.elements;
    if (param_elements != t.elements && param_elements != full) {
      return InvalidField(
          field, absl::StrCat("param_elements ", param_elements, " is neither ",
                              t.elements, " nor ", full));
    }
    MUONPS_ASSIGN_OR_RETURN(const LentTensor lent,
                            buffers.Map(t, t.elements, param_elements));
    b.Lend(lent);
    b.param_elements = param_elements;
    b.full_param = spec.layout == scheduler::Layout::kRowSharded &&
                   param_elements == full && full != t.elements;
    b.layout = spec.layout;
    trainer.matrices[it->second] = b;
    trainer.bound_position[it->second] = bound_count++;
    bound[it->second] = true;
  }
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (!bound[m]) {
      return FieldError(absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("matrix ", Quoted(matrices[m].name)),
                        "is not bound by the trainer");
    }
  }
  std::sort(trainer.adamw.begin(), trainer.adamw.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<AdamWTensorSpec> specs;
  std::vector<int> matrix_groups;
  for (size_t i = 0; i < trainer.adamw.size(); ++i) {
    if (trainer.adamw[i].second.layout == scheduler::Layout::kUnreduced) {
      trainer.unreduced.push_back(static_cast<int>(i));
    }
  }
  for (const Binding& b : trainer.matrices) {
    if (b.layout == scheduler::Layout::kRowSharded && !b.full_param) {
      trainer.full_params = false;
    }
  }
  for (const auto& [name, b] : trainer.adamw) {
    specs.push_back(
        {name, b.elements, b.layout == scheduler::Layout::kUnreduced, b.group});
    trainer.group_count = std::max(trainer.group_count, b.group + 1);
  }
  for (const Binding& b : trainer.matrices) {
    matrix_groups.push_back(b.group);
    trainer.group_count = std::max(trainer.group_count, b.group + 1);
  }
  trainer.tensors_hash = TensorsHash(specs, matrix_groups);
  return trainer;
}

bool SameMatrices(const std::vector<scheduler::MatrixSpec>& a,
                  const std::vector<scheduler::MatrixSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t m = 0; m < a.size(); ++m) {
    if (a[m].name != b[m].name || a[m].rows != b[m].rows ||
        a[m].cols != b[m].cols || a[m].experts != b[m].experts ||
        a[m].layout != b[m].layout ||
        a[m].shard_experts != b[m].shard_experts) {
      return false;
    }
  }
  return true;
}

}  // namespace worker
}  // namespace muonps
