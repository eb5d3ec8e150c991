#include "server/worker/trainer_buffers.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/device_ops.h"
#include "lending/shared_memory.h"
#include "lending/undo_area.h"

namespace muonps {
namespace worker {
namespace {

class SharedMemoryBuffers final : public TrainerBuffers {
 public:
  // `record` points at the step record in the segment, or is null; `undo`
  // at the undo area of `undo_bytes`, or is null.
  SharedMemoryBuffers(SharedMemorySegment segment, uint64_t* record, void* undo,
                      int64_t undo_bytes)
      : segment_(std::move(segment)),
        record_(record),
        undo_(undo),
        undo_bytes_(undo_bytes) {}

  Device device() const override { return kHostDevice; }
  absl::Status CheckIntact() const override { return segment_.CheckSize(); }

  absl::StatusOr<LentTensor> Map(const TensorBinding& t, int64_t grad_elements,
                                 int64_t param_elements) override {
    const std::string field = absl::StrCat("tensor ", Quoted(t.name));
    MUONPS_ASSIGN_OR_RETURN(const DType dtype, LentDType(t));
    const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
    const int64_t size = static_cast<int64_t>(segment_.size());
    for (const auto& [offset, elements] :
         {std::pair<int64_t, int64_t>{t.grad_offset, grad_elements},
          {t.param_offset, param_elements}}) {
      // Compared without overflow: elements * width <= size - offset.
      if (elements < 1 || offset < 0 || offset % width != 0 || offset > size ||
          elements > (size - offset) / width) {
        return InvalidField(
            field,
            absl::StrCat("buffers of ", grad_elements, " and ", param_elements,
                         " ", DTypeName(dtype), " values at offsets ",
                         t.grad_offset, " and ", t.param_offset,
                         " do not fit the ", size, "-byte segment"));
      }
    }
    char* base = static_cast<char*>(segment_.data());
    return LentTensor{base + t.grad_offset, base + t.param_offset, dtype};
  }

  // The host stream runs each call as it is made: reads and writes happen
  // in its order. Atomic, because the trainer's process shares the page.
  absl::StatusOr<StepRecord> ReadRecord() override {
    if (record_ == nullptr) return absl::NotFoundError("no step record lent");
    uint64_t words[kStepRecordBytes / sizeof(uint64_t)] = {};
    for (size_t i = 0; i < std::size(words); ++i) {
      words[i] = __atomic_load_n(&record_[i], __ATOMIC_ACQUIRE);
    }
    return StepRecordFromWords(words);
  }
  absl::Status WriteRecord(Stream /*stream*/, StepRecordWord word,
                           uint64_t value) override {
    if (record_ == nullptr) return absl::OkStatus();
    __atomic_store_n(&record_[static_cast<int>(word)], value, __ATOMIC_RELEASE);
    return absl::OkStatus();
  }

  void* undo_area() const override { return undo_; }
  int64_t undo_area_bytes() const override { return undo_bytes_; }

 private:
  SharedMemorySegment segment_;
  uint64_t* const record_;  // in the segment; null: none lent
  void* const undo_;        // in the segment; null: none lent
  const int64_t undo_bytes_;
};

// Where an undo area lies in the segment.
struct UndoRange {
  int64_t offset = -1;  // -1: none lent (or it has no bytes)
  int64_t bytes = 0;
};

absl::StatusOr<UndoRange> UndoAreaInSegment(const AttachRequest& request) {
  const int64_t offset = request.undo_offset;
  const int64_t bytes = request.undo_bytes;
  if (offset == -1 && bytes == 0) return UndoRange{};
  if (offset < 0 || offset % kUndoSlotAlignment != 0 ||
      offset > request.segment_bytes) {
    return InvalidField(
        "undo_area.segment_offset",
        absl::StrCat(offset, " is not a multiple of ", kUndoSlotAlignment,
                     " inside the ", request.segment_bytes, "-byte segment"));
  }
  // Compared without overflow: bytes <= segment_bytes - offset.
  if (bytes < 0 || bytes > request.segment_bytes - offset) {
    return InvalidField(
        "undo_area.bytes",
        absl::StrCat(bytes, " bytes at offset ", offset, " are not inside the ",
                     request.segment_bytes, "-byte segment"));
  }
  if (bytes == 0) return UndoRange{};
  return UndoRange{offset, bytes};
}

}  // namespace

absl::StatusOr<DType> LentDType(const TensorBinding& binding) {
  MUONPS_RETURN_IF_ERROR(
      Annotate(kernels::CheckLentDType(binding.dtype),
               absl::StrCat("tensor ", Quoted(binding.name))));
  return binding.dtype;
}

absl::StatusOr<std::unique_ptr<TrainerBuffers>> OpenSharedMemoryBuffers(
    const AttachRequest& request) {
  if (!request.device.empty() && request.device != "cpu") {
    return InvalidField("device",
                        absl::StrCat("the trainer lends ", request.device,
                                     " memory; this worker runs on cpu"));
  }
  if (request.segment.empty()) {
    return InvalidField("segment",
                        "is empty: this worker takes host buffers in a "
                        "shared-memory segment");
  }
  if (request.segment_bytes <= 0) {
    return InvalidField("segment_bytes",
                        absl::StrCat(request.segment_bytes, " <= 0"));
  }
  MUONPS_ASSIGN_OR_RETURN(const UndoRange undo, UndoAreaInSegment(request));
  MUONPS_ASSIGN_OR_RETURN(
      SharedMemorySegment segment,
      SharedMemorySegment::Open(request.segment,
                                static_cast<size_t>(request.segment_bytes)));
  uint64_t* record = nullptr;
  if (request.step_record_offset >= 0) {
    const int64_t offset = request.step_record_offset;
    if (offset % static_cast<int64_t>(sizeof(uint64_t)) != 0 ||
        offset >
            request.segment_bytes - static_cast<int64_t>(kStepRecordBytes)) {
      return InvalidField(
          "step_record.segment_offset",
          absl::StrCat(offset, " is not a multiple of 8 with ",
                       kStepRecordBytes, " bytes of the ",
                       request.segment_bytes, "-byte segment after it"));
    }
    if (undo.offset >= 0 && offset < undo.offset + undo.bytes &&
        undo.offset < offset + static_cast<int64_t>(kStepRecordBytes)) {
      return InvalidField(
          "undo_area.segment_offset",
          absl::StrCat(undo.offset, " with ", undo.bytes,
                       " bytes overlaps the step record at ", offset));
    }
    record = reinterpret_cast<uint64_t*>(static_cast<char*>(segment.data()) +
                                         offset);
  }
  void* undo_area = nullptr;
  if (undo.offset >= 0) {
    undo_area = static_cast<char*>(segment.data()) + undo.offset;
  }
  return std::unique_ptr<TrainerBuffers>(new SharedMemoryBuffers(
      std::move(segment), record, undo_area, undo.bytes));
}

}  // namespace worker
}  // namespace muonps
