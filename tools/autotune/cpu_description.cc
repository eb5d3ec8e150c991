#include "tools/autotune/cpu_description.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace muonps {
namespace autotune {
namespace {

std::string ProcessorName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view view(line);
    if (!absl::ConsumePrefix(&view, "model name")) continue;
    const size_t colon = view.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name =
        absl::StripAsciiWhitespace(view.substr(colon + 1));
    if (!name.empty()) return std::string(name);
  }
  return "cpu";
}

}  // namespace

std::string CpuDescription(int threads) {
  std::string name = ProcessorName();
  if (threads > 0) absl::StrAppend(&name, " (", threads, " threads)");
  return name;
}

}  // namespace autotune
}  // namespace muonps
