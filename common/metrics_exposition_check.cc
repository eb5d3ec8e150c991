#include "common/metrics_exposition_check.h"

#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace muonps {
namespace metrics_test {
namespace {

bool IsNameChar(char c, bool first, bool colon) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         (colon && c == ':') || (!first && c >= '0' && c <= '9');
}

// [a-zA-Z_:][a-zA-Z0-9_:]* (metric names), or without ':' (label names).
bool IsName(const std::string& name, bool colon) {
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, colon)) return false;
  }
  return !name.empty();
}

// A Go float literal in decimal, or +Inf, -Inf, NaN as the format spells them.
bool IsValue(const std::string& value) {
  if (value == "+Inf" || value == "-Inf" || value == "NaN") return true;
  size_t i = (!value.empty() && (value[0] == '+' || value[0] == '-')) ? 1 : 0;
  size_t digits = 0;
  auto skip_digits = [&] {
    size_t n = 0;
    for (;
         i < value.size() && std::isdigit(static_cast<unsigned char>(value[i]));
         ++i)
      ++n;
    return n;
  };
  digits += skip_digits();
  if (i < value.size() && value[i] == '.') ++i, digits += skip_digits();
  if (digits == 0) return false;
  if (i < value.size() && (value[i] == 'e' || value[i] == 'E')) {
    ++i;
    if (i < value.size() && (value[i] == '+' || value[i] == '-')) ++i;
    if (skip_digits() == 0) return false;
  }
  return i == value.size();
}

}  // namespace

std::string ExpositionErrors(const std::string& text) {
  if (!text.empty() && text.back() != '\n') return "text must end in \\n";
  std::map<std::string, std::string> types;  // family -> kind
  std::set<std::string> helps, series;
  std::string family;  // the family whose TYPE came last
  std::map<std::string, double> bucket_so_far, le_so_far, inf_bucket;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string where = absl::StrCat("line \"", line, "\": ");
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const size_t space = rest.find(' ');
      if (space == std::string::npos) return where + "no text after name";
      const std::string name = rest.substr(0, space);
      const std::string tail = rest.substr(space + 1);
      if (!IsName(name, true)) return where + "bad metric name";
      if (line[2] == 'H') {
        if (!helps.insert(name).second) return where + "second HELP";
        for (size_t i = 0; i < tail.size(); ++i) {
          if (tail[i] != '\\') continue;
          if (++i == tail.size() || (tail[i] != '\\' && tail[i] != 'n')) {
            return where + "bad escape in help";
          }
        }
        continue;
      }
      static const std::set<std::string> kKinds = {
          "counter", "gauge", "histogram", "summary", "untyped"};
      if (kKinds.count(tail) == 0) return where + "unknown type";
      if (types.count(name) > 0) return where + "second TYPE";
      if (!family.empty() && name < family) return where + "not sorted";
      types[name] = tail;
      family = name;
      continue;
    }
    if (!line.empty() && line[0] == '#') continue;  // plain comment
    // name
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i], i == 0, true)) ++i;
    const std::string name = line.substr(0, i);
    if (name.empty()) return where + "no metric name";
    // {label="value",...}: escapes \\ \" \n only, trailing comma allowed.
    std::string key, le;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find("=\"", i);
        if (eq == std::string::npos) return where + "bad label block";
        const std::string label = line.substr(i, eq - i);
        if (!IsName(label, false)) return where + "bad label name";
        std::string value;
        for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
          if (line[i] != '\\') {
            value += line[i];
          } else if (++i < line.size() && line[i] == 'n') {
            value += '\n';
          } else if (i < line.size() && (line[i] == '\\' || line[i] == '"')) {
            value += line[i];
          } else {
            return where + "bad escape in label value";
          }
        }
        if (++i >= line.size()) return where + "unterminated label value";
        if (label == "le") {
          le = value;
        } else {
          absl::StrAppend(&key, label, "=", value, ";");
        }
        if (line[i] == ',') {
          ++i;
        } else if (line[i] != '}') {
          return where + "expected , or }";
        }
      }
      if (i++ >= line.size()) return where + "unterminated label block";
    }
    const std::string labels = line.substr(name.size(), i - name.size());
    // value [timestamp]
    if (i >= line.size() || line[i++] != ' ') return where + "no value";
    std::string value = line.substr(i);
    const size_t space = value.find(' ');
    if (space != std::string::npos) {
      const std::string stamp = value.substr(space + 1);
      if (stamp.empty() ||
          stamp.find_first_not_of("-0123456789") != std::string::npos) {
        return where + "bad timestamp";
      }
      value.resize(space);
    }
    if (!IsValue(value)) return where + "bad value";
    if (!series.insert(name + labels).second) return where + "duplicate";
    const std::string kind = types.count(family) > 0 ? types[family] : "";
    if (kind == "histogram") {
      const std::string id = family + "|" + key;
      const double number = std::strtod(value.c_str(), nullptr);
      if (name == family + "_bucket") {
        if (!IsValue(le)) return where + "bucket without a valid le";
        const double bound = std::strtod(le.c_str(), nullptr);
        if (inf_bucket.count(id) > 0) return where + "bucket after +Inf";
        if (le_so_far.count(id) > 0 && bound <= le_so_far[id]) {
          return where + "le not increasing";
        }
        if (bucket_so_far.count(id) > 0 && number < bucket_so_far[id]) {
          return where + "buckets not cumulative";
        }
        le_so_far[id] = bound;
        bucket_so_far[id] = number;
        if (le == "+Inf") inf_bucket[id] = number;
      } else if (name == family + "_count") {
        if (inf_bucket.count(id) == 0 || inf_bucket[id] != number) {
          return where + "_count differs from le=\"+Inf\" bucket";
        }
      } else if (name != family + "_sum") {
        return where + "sample outside its family's group";
      }
    } else if (family.empty() || name != family) {
      return where + "sample outside its family's group";
    }
  }
  return "";
}

std::string RenderValid(const MetricsRegistry& registry) {
  std::string text = registry.RenderText();
  EXPECT_EQ(ExpositionErrors(text), "") << text;
  return text;
}

}  // namespace metrics_test
}  // namespace muonps
