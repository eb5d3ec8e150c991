// The framing every multi-message fuzz target reads its input in, and the
// seed generator writes: records of a tag byte, a little-endian uint16
// length and that many payload bytes (a payload cut short by the input's
// end is taken as it is). Thread-compatible.
#ifndef MUONPS_FUZZ_FUZZ_INPUT_H_
#define MUONPS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace muonps {
namespace fuzz {

// One record: which operation (`tag`, a target's own numbering) on which
// bytes (`payload`, usually a serialized request proto).
struct FuzzRecord {
  uint8_t tag = 0;
  std::string payload;
};

// Reads records off a fuzzer input; the input must outlive the reader.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next record, or false at the end of the input.
  bool Next(FuzzRecord* record) {
    if (offset_ >= size_) return false;
    record->tag = data_[offset_++];
    size_t length = 0;
    for (int i = 0; i < 2 && offset_ < size_; ++i) {
      length |= static_cast<size_t>(data_[offset_++]) << (8 * i);
    }
    if (length > size_ - offset_) length = size_ - offset_;
    record->payload.assign(reinterpret_cast<const char*>(data_ + offset_),
                           length);
    offset_ += length;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// Appends a record to `input` (the seed generator's side); payloads longer
// than 65535 bytes are cut there, as the reader would see them.
inline void AppendRecord(uint8_t tag, const std::string& payload,
                         std::string* input) {
  const size_t length = payload.size() < 0xffff ? payload.size() : 0xffff;
  input->push_back(static_cast<char>(tag));
  input->push_back(static_cast<char>(length & 0xff));
  input->push_back(static_cast<char>(length >> 8));
  input->append(payload, 0, length);
}

// With MUONPS_FUZZ_TRACE set, prints each call's outcome to stderr (to see
// how far a seed gets); silent otherwise.
inline void TraceCall(int tag, int code, const std::string& message) {
  static const bool trace = std::getenv("MUONPS_FUZZ_TRACE") != nullptr;
  if (trace)
    std::fprintf(stderr, "call %d: code %d %s\n", tag, code, message.c_str());
}

// Reads a C call's arguments off a record's payload: fixed-width
// little-endian numbers (zeros past the end) and strings up to a NUL (or
// the end). Keeps no copy: `payload` must outlive the reader.
class ArgReader {
 public:
  explicit ArgReader(const std::string& payload) : payload_(payload) {}

  uint64_t U64() { return TakeBits(8); }
  int64_t I64() { return static_cast<int64_t>(TakeBits(8)); }
  int32_t I32() { return static_cast<int32_t>(TakeBits(4)); }
  double Double() {
    const uint64_t bits = TakeBits(8);
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  }
  std::string String() {
    const size_t end = payload_.find('\0', offset_);
    const size_t stop = end == std::string::npos ? payload_.size() : end;
    std::string out = payload_.substr(offset_, stop - offset_);
    offset_ = stop < payload_.size() ? stop + 1 : stop;
    return out;
  }

 private:
  uint64_t TakeBits(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes && offset_ < payload_.size(); ++i) {
      value |=
          static_cast<uint64_t>(static_cast<unsigned char>(payload_[offset_++]))
          << (8 * i);
    }
    return value;
  }

  const std::string& payload_;
  size_t offset_ = 0;
};

// Writes what ArgReader reads (the seed generator's side).
class ArgWriter {
 public:
  ArgWriter& U64(uint64_t value) { return PutBits(value, 8); }
  ArgWriter& I64(int64_t value) {
    return PutBits(static_cast<uint64_t>(value), 8);
  }
  ArgWriter& I32(int32_t value) {
    return PutBits(static_cast<uint32_t>(value), 4);
  }
  ArgWriter& Double(double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    return PutBits(bits, 8);
  }
  ArgWriter& String(const std::string& value) {
    out_ += value;
    out_.push_back('\0');
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  ArgWriter& PutBits(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
    }
    return *this;
  }

  std::string out_;
};

}  // namespace fuzz
}  // namespace muonps

#endif  // MUONPS_FUZZ_FUZZ_INPUT_H_
