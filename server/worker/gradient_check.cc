#include "server/worker/gradient_check.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {

absl::Status CheckGradientsFinite(const PlanState& plan,
                                  const AttachedTrainer& trainer,
                                  kernels::DeviceOps& ops, Stream stream) {
  // Each worker checks the gradients this step reads from its trainer, so
  // every gradient the step reads is checked before anything changes. A
  // replicated gradient is read only by its owner's worker (every trainer
  // holds the same one), or, for an owner with no trainer, by trainer 0's
  // worker, which sends it: checking it everywhere read it N times over.
  const auto reads = [&](size_t m) {
    if (plan.matrices[m].layout != scheduler::Layout::kReplicated) {
      return true;  // every trainer's part or rows are read
    }
    for (const int32_t owner : plan.ownership.owners[m]) {
      if (owner == plan.rank) return true;
      if (owner >= plan.trainers() && trainer.rank == 0) return true;
    }
    return false;
  };
  // Spans by job matrix, then the AdamW tensors; a name is looked up only
  // for the span that is not finite.
  std::vector<kernels::FloatSpan> spans;
  std::vector<int> matrix_of;  // by span; -1 - i: AdamW tensor i
  for (size_t m = 0; m < plan.matrices.size(); ++m) {
    if (!reads(m)) continue;
    spans.push_back({trainer.matrices[m].grad, trainer.matrices[m].elements});
    matrix_of.push_back(static_cast<int>(m));
  }
  for (size_t i = 0; i < trainer.adamw.size(); ++i) {
    spans.push_back(
        {trainer.adamw[i].second.grad, trainer.adamw[i].second.elements});
    matrix_of.push_back(-1 - static_cast<int>(i));
  }
  absl::StatusOr<std::vector<int64_t>> bad = ops.FirstNonFinite(spans, stream);
  if (!bad.ok()) return Annotate(bad.status(), "finite check");
  for (size_t k = 0; k < spans.size(); ++k) {
    if ((*bad)[k] < 0) continue;
    float value = 0;
    const bool read =
        ops.Copy(&value, spans[k].data + (*bad)[k], 1, stream).ok() &&
        ops.Synchronize(stream).ok();
    const std::string& name = matrix_of[k] >= 0
                                  ? plan.matrices[matrix_of[k]].name
                                  : trainer.adamw[-1 - matrix_of[k]].first;
    return absl::InvalidArgumentError(
        absl::StrCat("grad of ", Quoted(name), ": element ", (*bad)[k], " is ",
                     !read               ? "not finite"
                     : std::isnan(value) ? "NaN"
                                         : "Inf"));
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
