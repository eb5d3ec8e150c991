#include "scheduler/plan_types.h"

#include <algorithm>

namespace muonps {
namespace scheduler {

absl::string_view LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kReplicated:
      return "replicated";
    case Layout::kUnreduced:
      return "unreduced";
    case Layout::kRowSharded:
      return "row_sharded";
  }
  return "unknown";
}

int64_t PayloadBytes(const MatrixSpec& matrix) {
  return matrix.rows * matrix.cols *
         static_cast<int64_t>(DTypeSize(matrix.dtype));
}

int64_t OwnedBytes(const MatrixSpec& matrix) {
  return 4 * matrix.rows * matrix.cols + 2 * PayloadBytes(matrix);
}

}  // namespace scheduler
}  // namespace muonps
