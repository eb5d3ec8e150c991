#include "server/worker/trainer_buffers.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/device_ops.h"
#include "lending/shared_memory.h"

namespace muonps {
namespace worker {
namespace {

class SharedMemoryBuffers final : public TrainerBuffers {
 public:
  // `record` points at the step record in the segment, or is null.
  SharedMemoryBuffers(SharedMemorySegment segment, uint64_t* record)
      : segment_(std::move(segment)), record_(record) {}

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

 private:
  SharedMemorySegment segment_;
  uint64_t* const record_;  // in the segment; null: none lent
};

}  // namespace

absl::StatusOr<std::vector<void*>> TrainerBuffers::MapPlaces(
    const std::vector<GradientPlace>& places,
    const std::vector<int64_t>& /*bytes*/) {
  if (places.empty()) return std::vector<void*>();
  return InvalidField("gradients[0]",
                      "a host trainer's gradients stay in its shared-memory "
                      "segment (only a CUDA trainer places them elsewhere)");
}

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
    record = reinterpret_cast<uint64_t*>(static_cast<char*>(segment.data()) +
                                         offset);
  }
  return std::unique_ptr<TrainerBuffers>(
      new SharedMemoryBuffers(std::move(segment), record));
}

}  // namespace worker
}  // namespace muonps
