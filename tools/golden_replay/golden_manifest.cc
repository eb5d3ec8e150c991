#include "tools/golden_replay/golden_manifest.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace golden {
namespace {

using Json = nlohmann::json;

// Field access that reports the JSON path instead of throwing.
class Fields {
 public:
  Fields(const Json& object, std::string path)
      : object_(object), path_(std::move(path)) {}

  std::string Path(absl::string_view key) const {
    return absl::StrCat(path_, ".", key);
  }
  bool Has(absl::string_view key) const {
    return object_.contains(std::string(key));
  }

  absl::StatusOr<std::string> String(absl::string_view key) const {
    const Json* value = Find(key);
    if (value == nullptr || !value->is_string()) {
      return InvalidField(Path(key), "must be a string");
    }
    return value->get<std::string>();
  }

  absl::StatusOr<double> Number(absl::string_view key) const {
    const Json* value = Find(key);
    if (value == nullptr || !value->is_number()) {
      return InvalidField(Path(key), "must be a number");
    }
    return value->get<double>();
  }

  // An integral number in [lo, hi].
  absl::StatusOr<int64_t> Integer(absl::string_view key, int64_t lo,
                                  int64_t hi) const {
    const Json* value = Find(key);
    if (value == nullptr || !value->is_number()) {
      return InvalidField(Path(key), "must be an integer");
    }
    const double d = value->get<double>();
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) ||
        d != std::floor(d)) {
      return InvalidField(Path(key), absl::StrCat(d, " is not an integer in [",
                                                  lo, ", ", hi, "]"));
    }
    return static_cast<int64_t>(d);
  }

  // Re-roots a status from a validator ("field: what") at this object:
  // "<path>.field: what".
  absl::Status Nest(const absl::Status& status) const {
    if (status.ok()) return status;
    return absl::Status(status.code(),
                        absl::StrCat(path_, ".", status.message()));
  }

  absl::StatusOr<bool> Bool(absl::string_view key) const {
    const Json* value = Find(key);
    if (value == nullptr || !value->is_boolean()) {
      return InvalidField(Path(key), "must be true or false");
    }
    return value->get<bool>();
  }

  absl::StatusOr<std::vector<double>> Numbers(absl::string_view key) const {
    const Json* value = Find(key);
    if (value == nullptr || !value->is_array()) {
      return InvalidField(Path(key), "must be an array of numbers");
    }
    std::vector<double> out;
    for (const Json& item : *value) {
      if (!item.is_number()) {
        return InvalidField(Path(key), "must be an array of numbers");
      }
      out.push_back(item.get<double>());
    }
    return out;
  }

  // Every key of the object must be in `known`.
  absl::Status OnlyKeys(std::initializer_list<absl::string_view> known) const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      bool found = false;
      for (absl::string_view k : known) found = found || it.key() == k;
      if (!found) return InvalidField(Path(it.key()), "is not supported");
    }
    return absl::OkStatus();
  }

 private:
  const Json* Find(absl::string_view key) const {
    auto it = object_.find(std::string(key));
    return it == object_.end() ? nullptr : &*it;
  }

  const Json& object_;
  std::string path_;
};

absl::Status ParseMuonHyper(const Fields& h, kernels::MuonHyperparameters* m) {
  MUONPS_RETURN_IF_ERROR(
      h.OnlyKeys({"lr", "weight_decay", "momentum", "nesterov", "ns_steps",
                  "adjust_lr_fn", "ns_coefficients", "eps"}));
  MUONPS_ASSIGN_OR_RETURN(m->lr, h.Number("lr"));
  if (h.Has("weight_decay")) {
    MUONPS_ASSIGN_OR_RETURN(m->weight_decay, h.Number("weight_decay"));
  }
  if (h.Has("momentum")) {
    MUONPS_ASSIGN_OR_RETURN(m->momentum, h.Number("momentum"));
  }
  if (h.Has("nesterov")) {
    MUONPS_ASSIGN_OR_RETURN(m->nesterov, h.Bool("nesterov"));
  }
  if (h.Has("ns_steps")) {
    MUONPS_ASSIGN_OR_RETURN(const int64_t steps, h.Integer("ns_steps", 1, 100));
    m->ns.steps = static_cast<int>(steps);
  }
  if (h.Has("eps")) {
    MUONPS_ASSIGN_OR_RETURN(m->ns.eps, h.Number("eps"));
  }
  if (h.Has("ns_coefficients")) {
    MUONPS_ASSIGN_OR_RETURN(const std::vector<double> c,
                            h.Numbers("ns_coefficients"));
    if (c.size() != 3) {
      return InvalidField(h.Path("ns_coefficients"), "must hold 3 numbers");
    }
    m->ns.coefficients = {c[0], c[1], c[2]};
  }
  if (h.Has("adjust_lr_fn")) {
    MUONPS_ASSIGN_OR_RETURN(const std::string fn, h.String("adjust_lr_fn"));
    auto adjustment = kernels::ParseLrAdjustment(fn);
    if (!adjustment.ok()) return h.Nest(adjustment.status());
    m->lr_adjustment = *adjustment;
  }
  return h.Nest(kernels::ValidateMuonHyperparameters(*m));
}

absl::Status ParseAdamWHyper(const Fields& h,
                             kernels::AdamWHyperparameters* a) {
  MUONPS_RETURN_IF_ERROR(h.OnlyKeys(
      {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"}));
  MUONPS_ASSIGN_OR_RETURN(a->lr, h.Number("lr"));
  if (h.Has("betas")) {
    MUONPS_ASSIGN_OR_RETURN(const std::vector<double> b, h.Numbers("betas"));
    if (b.size() != 2) return InvalidField(h.Path("betas"), "must hold 2");
    a->beta1 = b[0];
    a->beta2 = b[1];
  }
  if (h.Has("eps")) {
    MUONPS_ASSIGN_OR_RETURN(a->eps, h.Number("eps"));
  }
  if (h.Has("weight_decay")) {
    MUONPS_ASSIGN_OR_RETURN(a->weight_decay, h.Number("weight_decay"));
  }
  for (absl::string_view flag : {"amsgrad", "maximize"}) {
    if (!h.Has(flag)) continue;
    MUONPS_ASSIGN_OR_RETURN(const bool on, h.Bool(flag));
    if (on) return InvalidField(h.Path(flag), "true is not supported");
  }
  return h.Nest(kernels::ValidateAdamWHyperparameters(*a));
}

absl::Status ParseSteps(const Json& c, const std::string& path,
                        bool with_momentum, GoldenCase* out) {
  auto it = c.find("steps");
  if (it == c.end() || !it->is_array() || it->empty()) {
    return InvalidField(path + ".steps", "must be a non-empty array");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& step = (*it)[i];
    if (!step.is_object()) {
      return InvalidField(absl::StrCat(path, ".steps[", i, "]"),
                          "must be an object");
    }
    Fields f(step, absl::StrCat(path, ".steps[", i, "]"));
    GoldenStep s;
    MUONPS_ASSIGN_OR_RETURN(s.grad, f.String("grad"));
    MUONPS_ASSIGN_OR_RETURN(s.param, f.String("param"));
    if (with_momentum) {
      MUONPS_ASSIGN_OR_RETURN(s.momentum, f.String("momentum"));
    }
    out->steps.push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<GoldenCase> ParseCase(const Json& c, size_t index) {
  const std::string path = absl::StrCat("cases[", index, "]");
  if (!c.is_object()) return InvalidField(path, "must be an object");
  Fields f(c, path);
  GoldenCase out;
  MUONPS_ASSIGN_OR_RETURN(out.name, f.String("name"));
  MUONPS_ASSIGN_OR_RETURN(const std::string kind, f.String("kind"));
  MUONPS_ASSIGN_OR_RETURN(const std::vector<double> shape, f.Numbers("shape"));
  for (double d : shape) {
    if (d < 1 || d > 1e9 || d != static_cast<int64_t>(d)) {
      return InvalidField(f.Path("shape"),
                          "dimensions must be integers in [1, 1e9]");
    }
    out.shape.push_back(static_cast<int64_t>(d));
  }
  if (out.shape.empty()) return InvalidField(f.Path("shape"), "is empty");
  // Bounded so that element and byte counts stay far from int64 overflow.
  constexpr int64_t kMaxElements = int64_t{1} << 31;
  int64_t elements = 1;
  for (int64_t d : out.shape) {
    if (elements > kMaxElements / d) {
      return InvalidField(f.Path("shape"), "holds more than 2^31 elements");
    }
    elements *= d;
  }
  if (kind == "muon" || kind == "newton_schulz") {
    out.kind = kind == "muon" ? CaseKind::kMuon : CaseKind::kNewtonSchulz;
    if (out.shape.size() < 2 || out.shape.size() > 3) {
      return InvalidField(f.Path("shape"),
                          "must be [rows, cols] or [batch, rows, cols]");
    }
  } else if (kind == "adamw") {
    out.kind = CaseKind::kAdamW;
  } else {
    return InvalidField(f.Path("kind"),
                        absl::StrCat(Quoted(kind),
                                     " is not one of muon, adamw, "
                                     "newton_schulz"));
  }
  if (out.kind == CaseKind::kNewtonSchulz) {
    MUONPS_RETURN_IF_ERROR(f.OnlyKeys({"kind", "name", "shape", "coefficients",
                                       "ns_steps", "eps", "input", "output"}));
    MUONPS_ASSIGN_OR_RETURN(out.input, f.String("input"));
    MUONPS_ASSIGN_OR_RETURN(out.output, f.String("output"));
    if (f.Has("ns_steps")) {
      MUONPS_ASSIGN_OR_RETURN(const int64_t steps,
                              f.Integer("ns_steps", 1, 100));
      out.ns.steps = static_cast<int>(steps);
    }
    if (f.Has("eps")) {
      MUONPS_ASSIGN_OR_RETURN(out.ns.eps, f.Number("eps"));
    }
    if (f.Has("coefficients")) {
      MUONPS_ASSIGN_OR_RETURN(const std::vector<double> k,
                              f.Numbers("coefficients"));
      if (k.size() != 3) {
        return InvalidField(f.Path("coefficients"), "must hold 3 numbers");
      }
      out.ns.coefficients = {k[0], k[1], k[2]};
    }
    MUONPS_RETURN_IF_ERROR(f.Nest(ValidateNewtonSchulzOptions(out.ns)));
    return out;
  }
  MUONPS_RETURN_IF_ERROR(
      f.OnlyKeys({"kind", "name", "shape", "hyper", "steps", "p0"}));
  MUONPS_ASSIGN_OR_RETURN(out.p0, f.String("p0"));
  auto hyper = c.find("hyper");
  if (hyper == c.end() || !hyper->is_object()) {
    return InvalidField(f.Path("hyper"), "must be an object");
  }
  Fields h(*hyper, f.Path("hyper"));
  if (out.kind == CaseKind::kMuon) {
    MUONPS_RETURN_IF_ERROR(ParseMuonHyper(h, &out.muon));
  } else {
    MUONPS_RETURN_IF_ERROR(ParseAdamWHyper(h, &out.adamw));
  }
  MUONPS_RETURN_IF_ERROR(
      ParseSteps(c, path, out.kind == CaseKind::kMuon, &out));
  return out;
}

}  // namespace

absl::string_view CaseKindName(CaseKind kind) {
  switch (kind) {
    case CaseKind::kMuon:
      return "muon";
    case CaseKind::kAdamW:
      return "adamw";
    case CaseKind::kNewtonSchulz:
      return "newton_schulz";
  }
  return "unknown";
}

int64_t GoldenCase::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t GoldenCase::batch() const { return shape.size() == 3 ? shape[0] : 1; }
int64_t GoldenCase::rows() const { return shape[shape.size() - 2]; }
int64_t GoldenCase::cols() const { return shape.back(); }

absl::StatusOr<GoldenManifest> LoadGoldenManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream file(path);
  if (!file) {
    return FieldError(absl::StatusCode::kNotFound, "golden",
                      absl::StrCat("cannot open ", Quoted(path)));
  }
  const std::string text((std::istreambuf_iterator<char>(file)),
                         std::istreambuf_iterator<char>());
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return InvalidField(path, "is not a JSON object");
  }
  GoldenManifest manifest;
  manifest.dir = dir;
  auto source = root.find("source");
  if (source != root.end() && source->is_string()) {
    manifest.source = source->get<std::string>();
  }
  auto cases = root.find("cases");
  if (cases == root.end() || !cases->is_array() || cases->empty()) {
    return InvalidField("cases", "must be a non-empty array");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < cases->size(); ++i) {
    MUONPS_ASSIGN_OR_RETURN(GoldenCase c, ParseCase((*cases)[i], i));
    if (!names.insert(c.name).second) {
      return InvalidField(absl::StrCat("cases[", i, "].name"),
                          absl::StrCat(Quoted(c.name), " appears twice"));
    }
    manifest.cases.push_back(std::move(c));
  }
  return manifest;
}

absl::StatusOr<std::vector<float>> ReadTensor(const std::string& dir,
                                              const std::string& file,
                                              int64_t elements) {
  if (file.empty() || file.find("..") != std::string::npos ||
      file.front() == '/') {
    return InvalidField("file", absl::StrCat(Quoted(file),
                                             " must be a plain file name "
                                             "inside the golden folder"));
  }
  if (elements < 0 || elements > (int64_t{1} << 31)) {
    return InvalidField("elements",
                        absl::StrCat(elements, " is not in [0, 2^31]"));
  }
  const std::string path = dir + "/" + file;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return FieldError(absl::StatusCode::kNotFound, "file",
                      absl::StrCat("cannot open ", Quoted(path)));
  }
  const std::streamoff bytes = in.tellg();
  if (bytes != elements * static_cast<std::streamoff>(sizeof(float))) {
    return FieldError(absl::StatusCode::kDataLoss, Quoted(path),
                      absl::StrCat("holds ", bytes, " bytes; expected ",
                                   elements * sizeof(float)));
  }
  std::vector<float> data(elements);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(data.data()), bytes);
  if (!in) {
    return FieldError(absl::StatusCode::kDataLoss, Quoted(path), "short read");
  }
  return data;
}

}  // namespace golden
}  // namespace muonps
