#include "lending/undo_area.h"

namespace muonps {

UndoLayout UndoAreaLayout(absl::Span<const int64_t> param_elements) {
  UndoLayout out;
  out.offsets.reserve(param_elements.size());
  for (const int64_t elements : param_elements) {
    out.offsets.push_back(out.bytes);
    const int64_t bytes =
        elements > 0 ? elements * static_cast<int64_t>(sizeof(float)) : 0;
    out.bytes += (bytes + kUndoSlotAlignment - 1) / kUndoSlotAlignment *
                 kUndoSlotAlignment;
  }
  return out;
}

}  // namespace muonps
