#include "tests/gpu_two_gpus_trainer.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "tests/client_options.h"

namespace muonps {
namespace testing {
namespace {

// How long the trainer waits for its own stream (the worker's done signal,
// or the client's release of it after a failed step).
constexpr absl::Duration kStreamTimeout = absl::Seconds(30);

int64_t UnixMs() { return absl::ToUnixMillis(absl::Now()); }

// One line of the trainer's log, flushed at once (the test reads the log
// while the trainer runs, and a kill -9 must not lose what was said).
void Say(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::printf("\n");
  std::fflush(stdout);
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

// Polls `stream` until it is done, at most kStreamTimeout.
absl::Status AwaitStream(cudaStream_t stream) {
  const absl::Time deadline = absl::Now() + kStreamTimeout;
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return absl::InternalError(
          absl::StrCat("cudaStreamQuery: ", cudaGetErrorString(e)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the trainer's stream is not done after ",
                       absl::FormatDuration(kStreamTimeout),
                       " (no done signal from the worker, no release)"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace

int GpuOf(int rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1;
  return count >= 2 ? rank : 0;
}

namespace {

class Trainer {
 public:
  explicit Trainer(const TrainerConfig& config)
      : config_(config), layout_(LayoutOf(config.layout)) {}

  absl::Status Start() {
    if (cudaSetDevice(GpuOf(config_.rank)) != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaSetDevice(",
                                              GpuOf(config_.rank),
                                              ") in trainer ", config_.rank));
    }
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) !=
        cudaSuccess) {
      return absl::InternalError("cudaStreamCreateWithFlags");
    }
    absl::StatusOr<std::unique_ptr<Client>> created =
        Client::Create({.coordinator = config_.coordinator,
                        .job = config_.job,
                        .worker_socket = config_.socket,
                        .trainer_rank = config_.rank,
                        .trainer_count = config_.trainers,
                        .device = absl::StrCat("cuda:", GpuOf(config_.rank))});
    if (!created.ok()) return created.status();
    client_ = *std::move(created);
    // The failure tests restart a killed worker with no checkpoint: its
    // matrices start again from zero momentum, counted (momentum_reset).
    MUONPS_RETURN_IF_ERROR(client_->AllowMomentumReset(true));
    MUONPS_RETURN_IF_ERROR(client_->ExpectDedicatedWorkers(config_.dedicated));
    const int64_t width = static_cast<int64_t>(DTypeSize(config_.dtype));
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      MUONPS_RETURN_IF_ERROR(
          client_->AddMatrix(c.name, c.rows, c.cols,
                             {.layout = ClientLayout(layout_),
                              .layer = static_cast<int32_t>(m),
                              .experts = c.experts}));
      const int64_t n =
          LentElements(c, layout_, config_.rank, config_.trainers);
      char* block = nullptr;
      if (cudaMalloc(&block, 2 * n * width) != cudaSuccess) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cudaMalloc ", c.name));
      }
      const auto [b, e] =
          TrainerRows(c, layout_, config_.rank, config_.trainers);
      std::vector<float> init(n);
      for (int64_t ex = 0; ex < c.experts; ++ex) {
        for (int64_t i = 0; i < (e - b) * c.cols; ++i) {
          init[ex * (e - b) * c.cols + i] =
              InitialParam(m, ex * c.rows * c.cols + b * c.cols + i);
        }
      }
      char* param = block + n * width;
      MUONPS_RETURN_IF_ERROR(UploadAs(config_.dtype, init, param));
      grads_.push_back(block);
      params_.push_back(param);
      MUONPS_RETURN_IF_ERROR(
          client_->LendCuda(c.name, block, param, ClientDType(config_.dtype)));
    }
    MuonOptions muon;
    muon.lr = 0.02;
    muon.weight_decay = 0.1;
    MUONPS_RETURN_IF_ERROR(client_->Start(muon, AdamWOptions()));
    Say("trainer=%d started pid=%d on cuda:%d", config_.rank, getpid(),
        GpuOf(config_.rank));
    if (config_.rank == 0) {
      absl::StatusOr<std::map<std::string, NsAlgorithm>> algorithms =
          NsAlgorithmsOf(client_->NsAlgorithms());
      if (!algorithms.ok()) return algorithms.status();
      for (const auto& [name, algorithm] : *algorithms) {
        Say("trainer=0 ns %s=%s", name.c_str(),
            std::string(NsAlgorithmName(algorithm)).c_str());
      }
    }
    return absl::OkStatus();
  }

  // Every step from first to last, each retried until answered.
  absl::Status Train() {
    for (int64_t step = config_.first_step; step <= config_.last_step; ++step) {
      const absl::Time give_up = absl::Now() + config_.retry_for;
      for (int attempt = 0;; ++attempt) {
        // Written before every attempt: a failed one may have left a
        // partial reduction in the lent gradients.
        MUONPS_RETURN_IF_ERROR(WriteGradients(step));
        Say("trainer=%d step=%" PRId64 " attempt=%d calling", config_.rank,
            step, attempt);
        const absl::Time start = absl::Now();
        absl::StatusOr<StepResult> r = client_->Step(step, {.stream = stream_});
        const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
        // The stream waits for the worker's done signal (or the client's
        // release after a failure): nothing is read or written before.
        MUONPS_RETURN_IF_ERROR(AwaitStream(stream_));
        if (r.ok()) {
          Say("trainer=%d step=%" PRId64 " attempt=%d ok plan_version=%" PRId64
              " momentum_reset=%" PRId64 " seconds=%.3f at_ms=%" PRId64,
              config_.rank, step, attempt, r->plan_version, r->momentum_reset,
              seconds, UnixMs());
          break;
        }
        Say("trainer=%d step=%" PRId64
            " attempt=%d failed plan_version=-1 momentum_reset=0 seconds=%.3f "
            "at_ms=%" PRId64 " code=%s: %s",
            config_.rank, step, attempt, seconds, UnixMs(),
            absl::StatusCodeToString(r.status().code()).c_str(),
            OneLine(std::string(r.status().message())).c_str());
        if (absl::Now() >= give_up) {
          return absl::DeadlineExceededError(
              absl::StrCat("step ", step, " unanswered after ", attempt + 1,
                           " attempts: ", r.status().ToString()));
        }
        absl::SleepFor(absl::Milliseconds(200));
      }
    }
    return absl::OkStatus();
  }

  // Count then values (float), per matrix; written aside, then renamed.
  absl::Status WriteParams() {
    // As this trainer's next kernels would read them: after its stream's
    // wait for the worker's done counter.
    if (cudaStreamSynchronize(stream_) != cudaSuccess) {
      return absl::InternalError("cudaStreamSynchronize before the download");
    }
    const std::string temp = config_.params_out + ".tmp";
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      for (size_t m = 0; m < Matrices().size(); ++m) {
        const int64_t n = LentElements(Matrices()[m], layout_, config_.rank,
                                       config_.trainers);
        absl::StatusOr<std::vector<float>> values =
            DownloadAs(config_.dtype, params_[m], n);
        if (!values.ok()) return values.status();
        out.write(reinterpret_cast<const char*>(&n), sizeof(n));
        out.write(reinterpret_cast<const char*>(values->data()),
                  static_cast<std::streamsize>(n * sizeof(float)));
      }
      if (!out.good()) {
        return absl::InternalError(absl::StrCat("cannot write ", temp));
      }
    }
    if (std::rename(temp.c_str(), config_.params_out.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot rename ", temp, " to ", config_.params_out));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status WriteGradients(int64_t step) {
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      const auto [b, e] =
          TrainerRows(c, layout_, config_.rank, config_.trainers);
      std::vector<float> g((e - b) * c.cols * c.experts);
      for (int64_t ex = 0; ex < c.experts; ++ex) {
        for (int64_t i = 0; i < (e - b) * c.cols; ++i) {
          g[ex * (e - b) * c.cols + i] =
              TrainerGrad(layout_, step, m, config_.rank,
                          ex * c.rows * c.cols + b * c.cols + i);
        }
      }
      MUONPS_RETURN_IF_ERROR(UploadAs(config_.dtype, g, grads_[m]));
    }
    return absl::OkStatus();
  }

  const TrainerConfig config_;
  const scheduler::Layout layout_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Client> client_;
  std::vector<char*> grads_, params_;  // by matrix
};

}  // namespace

scheduler::Layout LayoutOf(const std::string& name) {
  return name == "unreduced"     ? scheduler::Layout::kUnreduced
         : name == "row_sharded" ? scheduler::Layout::kRowSharded
                                 : scheduler::Layout::kReplicated;
}

std::pair<int64_t, int64_t> TrainerRows(const MatrixCase& c,
                                        scheduler::Layout layout, int rank,
                                        int trainers) {
  if (layout != scheduler::Layout::kRowSharded) return {0, c.rows};
  return TrainerRowRange(c.rows, rank, trainers);
}

int64_t LentElements(const MatrixCase& c, scheduler::Layout layout, int rank,
                     int trainers) {
  const auto [b, e] = TrainerRows(c, layout, rank, trainers);
  return (e - b) * c.cols * c.experts;
}

float InitialParam(size_t m, int64_t i) {
  return 0.02f * std::sin(0.1f * static_cast<float>(i) + m);
}

float TrainerGrad(scheduler::Layout layout, int64_t step, size_t m, int rank,
                  int64_t i) {
  const int source = layout == scheduler::Layout::kUnreduced ? rank : 0;
  return GradValue(step * 2 + source, static_cast<int>(m), i);
}

std::vector<std::string> TrainerArgs(const TrainerConfig& c) {
  return {kTrainerFlag,
          "coordinator=" + c.coordinator,
          "job=" + c.job,
          "socket=" + c.socket,
          absl::StrCat("rank=", c.rank),
          absl::StrCat("trainers=", c.trainers),
          absl::StrCat("dedicated=", c.dedicated),
          "layout=" + c.layout,
          absl::StrCat("dtype=", c.dtype == DType::kBFloat16 ? "bf16" : "fp32"),
          absl::StrCat("first_step=", c.first_step),
          absl::StrCat("last_step=", c.last_step),
          "params_out=" + c.params_out,
          absl::StrCat("retry_ms=", absl::ToInt64Milliseconds(c.retry_for))};
}

absl::StatusOr<TrainerConfig> ParseTrainerArgs(int argc, char** argv) {
  TrainerConfig c;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    int64_t retry_ms = 0;
    bool ok = eq != std::string::npos;
    if (key == "coordinator") {
      c.coordinator = value;
    } else if (key == "job") {
      c.job = value;
    } else if (key == "socket") {
      c.socket = value;
    } else if (key == "rank") {
      ok = ok && absl::SimpleAtoi(value, &c.rank) && c.rank >= 0;
    } else if (key == "trainers") {
      ok = ok && absl::SimpleAtoi(value, &c.trainers) && c.trainers >= 1;
    } else if (key == "dedicated") {
      ok = ok && absl::SimpleAtoi(value, &c.dedicated) && c.dedicated >= 0;
    } else if (key == "layout") {
      c.layout = value;
    } else if (key == "dtype") {
      ok = ok && (value == "bf16" || value == "fp32");
      c.dtype = value == "bf16" ? DType::kBFloat16 : DType::kFloat32;
    } else if (key == "first_step") {
      ok = ok && absl::SimpleAtoi(value, &c.first_step);
    } else if (key == "last_step") {
      ok = ok && absl::SimpleAtoi(value, &c.last_step);
    } else if (key == "params_out") {
      c.params_out = value;
    } else if (key == "retry_ms") {
      ok = ok && absl::SimpleAtoi(value, &retry_ms);
      c.retry_for = absl::Milliseconds(retry_ms);
    } else {
      ok = false;
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer argument \"", arg,
                       "\" is not KEY=VALUE of "
                       "a known key with a valid value"));
    }
  }
  if (c.rank >= c.trainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer argument rank=", c.rank,
                     " is not below trainers=", c.trainers));
  }
  return c;
}

int RunTrainer(const TrainerConfig& config) {
  Trainer trainer(config);
  absl::Status s = trainer.Start();
  if (s.ok()) s = trainer.Train();
  if (s.ok()) s = trainer.WriteParams();
  if (!s.ok()) {
    Say("trainer=%d FAILED: %s", config.rank, OneLine(s.ToString()).c_str());
    std::_Exit(1);
  }
  Say("trainer=%d done", config.rank);
  // No teardown: the workers release the lent memory once this process is
  // gone, and a CUDA teardown racing their mappings could only hang here.
  std::_Exit(0);
}

std::vector<StepAttempt> ParseAttempts(const std::string& log) {
  static const auto* re = new std::regex(
      R"(^trainer=(\d+) step=(\d+) attempt=(\d+) (ok|failed) )"
      R"(plan_version=(-?\d+) momentum_reset=(\d+) seconds=([0-9.]+) )"
      R"(at_ms=(\d+)(?: code=(\w+): (.*))?$)");
  std::vector<StepAttempt> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, *re)) continue;
    StepAttempt a;
    (void)absl::SimpleAtoi(m[1].str(), &a.rank);
    (void)absl::SimpleAtoi(m[2].str(), &a.step);
    (void)absl::SimpleAtoi(m[3].str(), &a.attempt);
    a.ok = m[4] == "ok";
    (void)absl::SimpleAtoi(m[5].str(), &a.plan_version);
    (void)absl::SimpleAtoi(m[6].str(), &a.momentum_reset);
    (void)absl::SimpleAtod(m[7].str(), &a.seconds);
    (void)absl::SimpleAtoi(m[8].str(), &a.at_ms);
    a.code = m[9].str();
    a.message = m[10].str();
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<std::map<std::string, NsAlgorithm>> ParseNsAlgorithms(
    const std::string& log) {
  static const auto* re = new std::regex(R"(^trainer=0 ns (\S+)=(\S+)$)");
  std::map<std::string, NsAlgorithm> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, *re)) continue;
    absl::StatusOr<NsAlgorithm> algorithm = ParseNsAlgorithm(m[2].str());
    if (!algorithm.ok()) return algorithm.status();
    out[m[1].str()] = *algorithm;
  }
  for (const MatrixCase& c : Matrices()) {
    if (out.count(c.name) == 0) {
      return absl::NotFoundError(
          absl::StrCat("trainer 0 logged no NS algorithm for ", c.name));
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> ReadTrainerParams(
    const std::string& path, scheduler::Layout layout, int rank, int trainers) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no file ", path));
  std::vector<std::vector<float>> out;
  for (const MatrixCase& c : Matrices()) {
    int64_t n = -1;
    in.read(reinterpret_cast<char*>(&n), sizeof(n));
    if (!in || n != LentElements(c, layout, rank, trainers)) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", c.name, " has ", n, " values, expected ",
                       LentElements(c, layout, rank, trainers)));
    }
    std::vector<float> values(n);
    in.read(reinterpret_cast<char*>(values.data()),
            static_cast<std::streamsize>(n * sizeof(float)));
    if (!in) return absl::DataLossError(absl::StrCat(path, " is short"));
    out.push_back(std::move(values));
  }
  return out;
}

}  // namespace testing
}  // namespace muonps
