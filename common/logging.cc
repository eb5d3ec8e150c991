#include "common/logging.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace muonps {

absl::Status SetUpLogging(const LoggingOptions& options) {
  const spdlog::level::level_enum level =
      spdlog::level::from_str(options.level);
  // from_str maps unknown names to "off"; only "off" itself may mean off.
  if (level == spdlog::level::off && options.level != "off") {
    return InvalidField("level",
                        absl::StrCat(Quoted(options.level),
                                     " is not one of trace, debug, info, "
                                     "warn, error, critical, off"));
  }
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (!options.file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(
          options.file, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      return FieldError(
          absl::StatusCode::kUnavailable, "file",
          absl::StrCat("cannot open ", Quoted(options.file), ": ", e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(options.component,
                                                 sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace muonps
