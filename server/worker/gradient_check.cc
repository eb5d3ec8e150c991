#include "server/worker/gradient_check.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {

GradientCheck::GradientCheck(const PlanState& plan,
                             const AttachedTrainer& trainer,
                             kernels::DeviceOps& ops, Stream stream)
    : plan_(plan),
      trainer_(trainer),
      ops_(ops),
      stream_(stream),
      number_(plan.matrices.size(), -1) {
  const auto reads = [&](size_t m) {
    if (plan.matrices[m].layout != scheduler::Layout::kReplicated) {
      return true;  // every trainer's part or rows are read
    }
    for (const int32_t owner : plan.ownership.owners[m]) {
      if (plan.OwnsInGroup(owner)) return true;
      if (owner >= plan.trainers() && trainer.rank == 0) return true;
    }
    return false;
  };
  for (size_t m = 0; m < plan.matrices.size(); ++m) {
    if (reads(m)) number_[m] = count_++;
  }
  adamw_first_ = count_;
  count_ += static_cast<int64_t>(trainer.adamw.size());
}

absl::Status GradientCheck::Prepare() {
  return Annotate(ops_.PrepareFiniteChecks(count_, stream_), "finite check");
}

absl::Status GradientCheck::Matrix(int32_t matrix) {
  if (number_[matrix] < 0) return absl::OkStatus();
  const Binding& b = trainer_.matrices[matrix];
  const kernels::FloatSpan span{b.grad, b.elements};
  return Annotate(ops_.CheckFinite({&span, 1}, number_[matrix], stream_),
                  "finite check");
}

absl::Status GradientCheck::AdamW() {
  std::vector<kernels::FloatSpan> spans;
  spans.reserve(trainer_.adamw.size());
  for (const auto& [name, b] : trainer_.adamw) {
    spans.push_back({b.grad, b.elements});
  }
  return Annotate(ops_.CheckFinite(spans, adamw_first_, stream_),
                  "finite check");
}

absl::Status GradientCheck::Result() {
  absl::StatusOr<std::vector<int64_t>> bad =
      ops_.FiniteResults(count_, stream_);
  if (!bad.ok()) return Annotate(bad.status(), "finite check");
  for (int64_t k = 0; k < count_; ++k) {
    if ((*bad)[k] < 0) continue;
    // A name is looked up only for the span that is not finite.
    const float* data = nullptr;
    const std::string* name = nullptr;
    if (k >= adamw_first_) {
      const auto& [tensor, b] = trainer_.adamw[k - adamw_first_];
      data = b.grad;
      name = &tensor;
    } else {
      for (size_t m = 0; m < number_.size(); ++m) {
        if (number_[m] != k) continue;
        data = trainer_.matrices[m].grad;
        name = &plan_.matrices[m].name;
        break;
      }
    }
    float value = 0;
    const bool read = ops_.Copy(&value, data + (*bad)[k], 1, stream_).ok() &&
                      ops_.Synchronize(stream_).ok();
    return absl::InvalidArgumentError(
        absl::StrCat("grad of ", Quoted(*name), ": element ", (*bad)[k], " is ",
                     !read               ? "not finite"
                     : std::isnan(value) ? "NaN"
                                         : "Inf"));
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
