#include "common/status.h"

#include "absl/strings/str_cat.h"

namespace muonps {

absl::Status FieldError(absl::StatusCode code, absl::string_view field,
                        absl::string_view what) {
  return absl::Status(code, absl::StrCat(field, ": ", what));
}

absl::Status InvalidField(absl::string_view field, absl::string_view what) {
  return FieldError(absl::StatusCode::kInvalidArgument, field, what);
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(),
                         absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&annotated](absl::string_view url, const absl::Cord& payload) {
        annotated.SetPayload(url, payload);
      });
  return annotated;
}

std::string Quoted(absl::string_view name) {
  constexpr size_t kMaxShown = 200;
  if (name.size() <= kMaxShown) return absl::StrCat("\"", name, "\"");
  return absl::StrCat("\"", name.substr(0, kMaxShown), "...\"");
}

}  // namespace muonps
