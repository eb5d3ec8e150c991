#include "common/logging.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace {

// A path under the test's private temporary directory, unique to this test
// and process.
std::string TempPath(const std::string& name) {
  std::string dir = testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir += '/';
  return dir + "logging_test_" + std::to_string(getpid()) + "_" + name;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Index of the first line containing every one of `parts`, or -1.
int FindLine(const std::vector<std::string>& lines,
             const std::vector<std::string>& parts) {
  for (size_t i = 0; i < lines.size(); ++i) {
    bool all = true;
    for (const std::string& part : parts) {
      all = all && lines[i].find(part) != std::string::npos;
    }
    if (all) return static_cast<int>(i);
  }
  return -1;
}

// Each test installs its own default logger; this puts back a stderr-only
// one afterwards so that no test leaves a file open for the next.
class LoggingTest : public testing::Test {
 protected:
  void TearDown() override {
    ASSERT_TRUE(SetUpLogging(LoggingOptions()).ok());
    for (const std::string& path : files_) std::remove(path.c_str());
    for (const std::string& dir : dirs_) rmdir(dir.c_str());
  }

  // A fresh path whose file (if created) is removed after the test.
  std::string LogFile(const std::string& name) {
    const std::string path = TempPath(name);
    std::remove(path.c_str());
    files_.push_back(path);
    return path;
  }

  std::vector<std::string> files_;
  std::vector<std::string> dirs_;  // removed after files_, innermost first
};

TEST_F(LoggingTest, UnknownLevelIsInvalidArgumentNamingLevel) {
  for (const char* level : {"verbose", "", "INFO", "warning "}) {
    LoggingOptions options;
    options.level = level;
    const absl::Status status = SetUpLogging(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << "level \"" << level << "\": " << status;
    EXPECT_NE(status.message().find("level"), absl::string_view::npos)
        << status;
  }
}

TEST_F(LoggingTest, EveryDocumentedLevelIncludingOffIsAccepted) {
  for (const char* level :
       {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    LoggingOptions options;
    options.level = level;
    EXPECT_TRUE(SetUpLogging(options).ok()) << level;
  }
  LoggingOptions off;
  off.level = "off";
  ASSERT_TRUE(SetUpLogging(off).ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::off);
}

TEST_F(LoggingTest, FileSinkReceivesLinesTaggedWithComponent) {
  LoggingOptions options;
  options.component = "worker-7";
  options.file = LogFile("file_sink.log");
  ASSERT_TRUE(SetUpLogging(options).ok());
  spdlog::info("plan_version={} installed", 42);
  spdlog::default_logger()->flush();
  const std::vector<std::string> lines = ReadLines(options.file);
  EXPECT_GE(FindLine(lines, {"worker-7", "plan_version=42 installed"}), 0)
      << "file has " << lines.size() << " lines";
}

TEST_F(LoggingTest, FileSinkAppendsRatherThanTruncates) {
  const std::string path = LogFile("append.log");
  {
    std::ofstream out(path);
    out << "line from an earlier run\n";
  }
  LoggingOptions options;
  options.component = "coordinator";
  options.file = path;
  ASSERT_TRUE(SetUpLogging(options).ok());
  spdlog::info("job=j1 started");
  spdlog::default_logger()->flush();
  const std::vector<std::string> lines = ReadLines(path);
  EXPECT_EQ(FindLine(lines, {"line from an earlier run"}), 0);
  EXPECT_GE(FindLine(lines, {"coordinator", "job=j1 started"}), 1);
}

TEST_F(LoggingTest, LinesBelowTheLevelAreNotWritten) {
  LoggingOptions options;
  options.component = "worker-2";
  options.level = "warn";
  options.file = LogFile("level.log");
  ASSERT_TRUE(SetUpLogging(options).ok());
  spdlog::info("step=1 below threshold");
  spdlog::warn("step=2 at threshold");
  spdlog::default_logger()->flush();
  const std::vector<std::string> lines = ReadLines(options.file);
  EXPECT_LT(FindLine(lines, {"below threshold"}), 0);
  EXPECT_GE(FindLine(lines, {"worker-2", "step=2 at threshold"}), 0);
}

TEST_F(LoggingTest, FailedSetUpKeepsThePreviousLogger) {
  LoggingOptions good;
  good.component = "keeper";
  good.file = LogFile("keep.log");
  ASSERT_TRUE(SetUpLogging(good).ok());

  LoggingOptions bad_level;
  bad_level.component = "replacement";
  bad_level.level = "loud";
  ASSERT_FALSE(SetUpLogging(bad_level).ok());
  LoggingOptions bad_file;
  bad_file.component = "replacement";
  bad_file.file = "/proc/self/no_such_dir/x.log";
  ASSERT_FALSE(SetUpLogging(bad_file).ok());

  spdlog::info("still here");
  spdlog::default_logger()->flush();
  const std::vector<std::string> lines = ReadLines(good.file);
  EXPECT_GE(FindLine(lines, {"keeper", "still here"}), 0);
  EXPECT_LT(FindLine(lines, {"replacement"}), 0);
}

TEST_F(LoggingTest, UnopenableFileIsUnavailableNamingFile) {
  // A regular file where a parent directory should be: neither the directory
  // nor the log file can be created.
  const std::string blocker = LogFile("not_a_dir");
  {
    std::ofstream out(blocker);
    out << "x";
  }
  LoggingOptions options;
  options.file = blocker + "/sub/unopenable.log";
  const absl::Status status = SetUpLogging(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("file"), absl::string_view::npos) << status;
}

TEST_F(LoggingTest, MissingParentDirectoryIsCreatedBySpdlog) {
  // spdlog's file sink creates missing parent directories, so a path in a
  // directory that does not exist yet is not an error.
  const std::string dir = TempPath("new_dir");
  LoggingOptions options;
  options.component = "worker-9";
  options.file = dir + "/run.log";
  std::remove(options.file.c_str());
  rmdir(dir.c_str());
  files_.push_back(options.file);
  dirs_.push_back(dir);
  const absl::Status status = SetUpLogging(options);
  ASSERT_TRUE(status.ok()) << status;
  spdlog::info("worker=9 up");
  spdlog::default_logger()->flush();
  EXPECT_GE(FindLine(ReadLines(options.file), {"worker-9", "worker=9 up"}), 0);
}

}  // namespace
}  // namespace muonps
