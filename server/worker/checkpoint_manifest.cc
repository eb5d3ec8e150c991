#include "server/worker/checkpoint_manifest.h"

#include <array>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace {

constexpr char kMagic[] = "MPSCKPT1";
constexpr size_t kMagicBytes = 8;

// Slicing-by-8 tables for the reflected Castagnoli polynomial: the data file
// of a large worker is gigabytes, so a byte-at-a-time loop would dominate.
struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t;
  constexpr Crc32cTables() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) {
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
      }
    }
  }
};
constexpr Crc32cTables kCrcTables;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutString(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// Reads little-endian fields off the front of untrusted bytes; every read
// names the field it was for when the bytes run out.
class ManifestReader {
 public:
  explicit ManifestReader(absl::string_view bytes) : rest_(bytes) {}

  absl::StatusOr<uint64_t> Uint(absl::string_view field, int width) {
    if (rest_.size() < static_cast<size_t>(width)) {
      return FieldError(absl::StatusCode::kDataLoss, field,
                        "manifest ends early");
    }
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(rest_[i]))
           << (8 * i);
    }
    rest_.remove_prefix(width);
    return v;
  }
  absl::StatusOr<uint32_t> U32(absl::string_view field) {
    MUONPS_ASSIGN_OR_RETURN(uint64_t v, Uint(field, 4));
    return static_cast<uint32_t>(v);
  }
  absl::StatusOr<int64_t> I64(absl::string_view field) {
    MUONPS_ASSIGN_OR_RETURN(uint64_t v, Uint(field, 8));
    return static_cast<int64_t>(v);
  }
  absl::StatusOr<std::string> String(absl::string_view field) {
    MUONPS_ASSIGN_OR_RETURN(uint32_t len, U32(field));
    if (len > kMaxCheckpointNameBytes) {
      return InvalidField(field, absl::StrCat("length ", len, " exceeds ",
                                              kMaxCheckpointNameBytes));
    }
    if (rest_.size() < len) {
      return FieldError(absl::StatusCode::kDataLoss, field,
                        "manifest ends early");
    }
    std::string s(rest_.substr(0, len));
    rest_.remove_prefix(len);
    return s;
  }
  size_t remaining() const { return rest_.size(); }

 private:
  absl::string_view rest_;
};

absl::StatusOr<CheckpointTensor> ParseTensor(ManifestReader& in,
                                             uint64_t data_bytes, uint32_t i) {
  const std::string at = absl::StrCat("tensors[", i, "]");
  CheckpointTensor t;
  MUONPS_ASSIGN_OR_RETURN(t.name, in.String(at + ".name"));
  if (t.name.empty()) return InvalidField(at + ".name", "must not be empty");
  const std::string field = absl::StrCat("tensor ", Quoted(t.name));
  MUONPS_ASSIGN_OR_RETURN(uint32_t expert, in.U32(field + ".expert"));
  t.expert = static_cast<int32_t>(expert);
  MUONPS_ASSIGN_OR_RETURN(t.rows, in.I64(field + ".rows"));
  MUONPS_ASSIGN_OR_RETURN(t.cols, in.I64(field + ".cols"));
  MUONPS_ASSIGN_OR_RETURN(uint32_t dtype, in.U32(field + ".dtype"));
  MUONPS_ASSIGN_OR_RETURN(t.offset, in.Uint(field + ".offset", 8));
  MUONPS_ASSIGN_OR_RETURN(t.length, in.Uint(field + ".length", 8));
  MUONPS_ASSIGN_OR_RETURN(t.crc32c, in.U32(field + ".crc32c"));
  if (t.expert < 0) return InvalidField(field + ".expert", "must be >= 0");
  if (t.rows <= 0) return InvalidField(field + ".rows", "must be > 0");
  if (t.cols <= 0) return InvalidField(field + ".cols", "must be > 0");
  if (dtype != static_cast<uint32_t>(CheckpointDtype::kFp32)) {
    return InvalidField(field + ".dtype",
                        absl::StrCat("unknown dtype ", dtype));
  }
  t.dtype = CheckpointDtype::kFp32;
  uint64_t elements = 0;
  uint64_t expected = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(t.rows),
                             static_cast<uint64_t>(t.cols), &elements) ||
      __builtin_mul_overflow(elements, uint64_t{sizeof(float)}, &expected)) {
    return InvalidField(field + ".rows", "rows * cols * 4 overflows");
  }
  if (t.length != expected) {
    return InvalidField(field + ".length",
                        absl::StrCat(t.length, " bytes, but [", t.rows, ", ",
                                     t.cols, "] fp32 needs ", expected));
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(t.offset, t.length, &end) || end > data_bytes) {
    return InvalidField(field + ".offset",
                        absl::StrCat("[", t.offset, ", +", t.length,
                                     ") reaches past data_bytes ", data_bytes));
  }
  return t;
}

}  // namespace

uint32_t Crc32c(absl::string_view bytes, uint32_t crc) {
  const auto& t = kCrcTables.t;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^
          t[4][lo >> 24] ^ t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^
          t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

std::string SerializeCheckpointManifest(const CheckpointManifest& manifest) {
  std::string out(kMagic, kMagicBytes);
  PutU32(&out, kCheckpointFormatVersion);
  PutU64(&out, static_cast<uint64_t>(manifest.step));
  PutU64(&out, static_cast<uint64_t>(manifest.plan_version));
  PutString(&out, manifest.worker_id);
  PutU64(&out, manifest.data_bytes);
  PutU32(&out, static_cast<uint32_t>(manifest.tensors.size()));
  for (const CheckpointTensor& t : manifest.tensors) {
    PutString(&out, t.name);
    PutU32(&out, static_cast<uint32_t>(t.expert));
    PutU64(&out, static_cast<uint64_t>(t.rows));
    PutU64(&out, static_cast<uint64_t>(t.cols));
    PutU32(&out, static_cast<uint32_t>(t.dtype));
    PutU64(&out, t.offset);
    PutU64(&out, t.length);
    PutU32(&out, t.crc32c);
  }
  PutU32(&out, Crc32c(out));
  return out;
}

absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(
    absl::string_view bytes) {
  if (bytes.size() < kMagicBytes + 4) {
    return FieldError(absl::StatusCode::kDataLoss, "manifest",
                      absl::StrCat("only ", bytes.size(), " bytes"));
  }
  // The checksum first: a torn or bit-flipped manifest is DATA_LOSS, and
  // only an intact one is judged field by field.
  const absl::string_view body = bytes.substr(0, bytes.size() - 4);
  ManifestReader trailer(bytes.substr(bytes.size() - 4));
  MUONPS_ASSIGN_OR_RETURN(uint32_t stored_crc, trailer.U32("manifest.crc32c"));
  if (Crc32c(body) != stored_crc) {
    return FieldError(absl::StatusCode::kDataLoss, "manifest.crc32c",
                      "does not match the manifest's bytes");
  }
  if (body.substr(0, kMagicBytes) != absl::string_view(kMagic, kMagicBytes)) {
    return InvalidField("manifest.magic", "not a muonps checkpoint manifest");
  }
  ManifestReader in(body.substr(kMagicBytes));
  MUONPS_ASSIGN_OR_RETURN(uint32_t version, in.U32("manifest.format_version"));
  if (version != kCheckpointFormatVersion) {
    return InvalidField("manifest.format_version",
                        absl::StrCat(version, " is not supported (want ",
                                     kCheckpointFormatVersion, ")"));
  }
  CheckpointManifest m;
  MUONPS_ASSIGN_OR_RETURN(m.step, in.I64("manifest.step"));
  MUONPS_ASSIGN_OR_RETURN(m.plan_version, in.I64("manifest.plan_version"));
  MUONPS_ASSIGN_OR_RETURN(m.worker_id, in.String("manifest.worker_id"));
  MUONPS_ASSIGN_OR_RETURN(m.data_bytes, in.Uint("manifest.data_bytes", 8));
  MUONPS_ASSIGN_OR_RETURN(uint32_t count, in.U32("manifest.tensor_count"));
  if (m.step < 0) return InvalidField("manifest.step", "must be >= 0");
  if (count > kMaxCheckpointTensors) {
    return InvalidField(
        "manifest.tensor_count",
        absl::StrCat(count, " exceeds ", kMaxCheckpointTensors));
  }
  // Each tensor takes at least 48 bytes, so a count the bytes cannot hold is
  // refused before anything is reserved for it.
  if (in.remaining() / 48 < count) {
    return FieldError(absl::StatusCode::kDataLoss, "manifest.tensor_count",
                      absl::StrCat(count, " tensors do not fit in ",
                                   in.remaining(), " bytes"));
  }
  m.tensors.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    MUONPS_ASSIGN_OR_RETURN(CheckpointTensor t,
                            ParseTensor(in, m.data_bytes, i));
    m.tensors.push_back(std::move(t));
  }
  if (in.remaining() != 0) {
    return FieldError(
        absl::StatusCode::kDataLoss, "manifest",
        absl::StrCat(in.remaining(), " bytes after the last tensor"));
  }
  return m;
}

}  // namespace muonps
