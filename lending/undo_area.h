// The undo area: memory a trainer lends its worker beside its buffers, into
// which the worker copies the trainer's Muon parameters before it starts
// writing a step's updates into them. A step that aborts part-way, or the
// successor of a worker killed part-way, puts the parameters back from it
// exactly. It lives in the trainer's memory (the shared segment, or a CUDA
// allocation of its own) so that it outlives the worker: 4 bytes per Muon
// parameter element the trainer lends, and nothing for AdamW tensors.
//
// One layout for the client that lends it (zero-filled) and the worker
// that writes and reads it: one slot per job matrix, in the job's matrix
// order, each holding that matrix's lent parameter as fp32 values (a bf16
// parameter is kept widened, so the round trip is exact), each slot
// starting at a multiple of kUndoSlotAlignment bytes. Pure functions;
// thread-safe.
#ifndef MUONPS_LENDING_UNDO_AREA_H_
#define MUONPS_LENDING_UNDO_AREA_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace muonps {

// Where every slot starts, relative to the area, and where the area starts
// in a shared segment (the area's own offset there is a multiple of it too).
constexpr int64_t kUndoSlotAlignment = 256;

// Byte offsets of each matrix's slot in the undo area, and the area's size.
struct UndoLayout {
  // By job matrix: the slot's byte offset in the area, a multiple of
  // kUndoSlotAlignment.
  std::vector<int64_t> offsets;
  // The whole area: every slot padded to a multiple of kUndoSlotAlignment
  // (0 when there is no matrix).
  int64_t bytes = 0;
};

// The layout for job matrices whose lent parameters hold `param_elements`
// values each, in job matrix order: matrix i's slot holds
// param_elements[i] fp32 values (the worker's Binding::param_elements: a
// row-sharded matrix's own rows unless the trainer lends the whole
// parameter, a replicated or unreduced one's whole parameter, experts
// included). A count < 1 gets an empty slot. The caller bounds the counts:
// 4 bytes per element over all the slots must fit int64_t.
UndoLayout UndoAreaLayout(absl::Span<const int64_t> param_elements);

}  // namespace muonps

#endif  // MUONPS_LENDING_UNDO_AREA_H_
