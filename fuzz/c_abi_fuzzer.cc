// libFuzzer target: the C ABI's argument checks (client/muonps_c.h). Each
// record of the input (fuzz/fuzz_input.h) is one call with arguments from
// its payload (fuzz/c_abi_tags.h numbers them), on the input's one handle
// (NULL until a create succeeds). Only calls that need no running service
// are made: everything before muonps_client_start, and the calls that
// refuse NULL arguments before they reach the worker. Pointers the ABI
// writes through or reads from always point at buffers of the size the
// call is told; NULL is passed where the ABI documents that it checks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/muonps_c.h"
#include "fuzz/c_abi_tags.h"
#include "fuzz/fuzz_input.h"
#include "grpc/grpc.h"

namespace muonps {
namespace fuzz {
namespace {

// Caller-side buffers are allocated only up to this many floats; a larger
// (or negative) count goes with NULL.
constexpr int64_t kMaxFloats = 4096;
constexpr int kMaxGroupNames = 16;
constexpr int64_t kMaxDeclaredElements = int64_t{1} << 16;

bool Bit(int32_t mask, int bit) { return (mask >> bit) & 1; }

// The same string, or NULL when `null` says so.
const char* OrNull(const std::string& s, bool null) {
  return null ? nullptr : s.c_str();
}

class CAbiUnderFuzz {
 public:
  ~CAbiUnderFuzz() { muonps_client_destroy(client_); }

  void Run(const FuzzRecord& record) {
    ArgReader in(record.payload);
    const int32_t nulls = in.I32();  // bit i: the i-th pointer is NULL
    switch (static_cast<CAbiCall>(record.tag % kCAbiCallCount)) {
      case CAbiCall::kCreate: {
        const std::string coordinator = in.String(), job = in.String(),
                          socket = in.String(), device = in.String();
        const int rank = in.I32(), count = in.I32();
        const double timeout = in.Double();
        muonps_client_destroy(client_);
        client_ = nullptr;
        muonps_client** out = Bit(nulls, 4) ? nullptr : &client_;
        if (muonps_client_create_on(
                OrNull(coordinator, Bit(nulls, 0)), OrNull(job, Bit(nulls, 1)),
                OrNull(socket, Bit(nulls, 2)), rank, count, timeout,
                OrNull(device, Bit(nulls, 3)), out) != MUONPS_OK) {
          TraceCall(0, -1, muonps_last_create_error());
        }
        return;
      }
      case CAbiCall::kAddMatrix: {
        const std::string name = in.String();
        const int64_t rows = in.I64(), cols = in.I64(), experts = in.I64();
        const int layout = in.I32(), layer = in.I32();
        Check(muonps_client_add_matrix(client_, OrNull(name, Bit(nulls, 0)),
                                       rows, cols, experts, layout, layer));
        return;
      }
      case CAbiCall::kAddTensor: {
        const std::string name = in.String();
        int64_t elements = in.I64();
        const int layout = in.I32();
        // The ABI allocates a tensor's AdamW moments (8 bytes an element) at
        // declaration: a count it accepts but no test machine could hold is
        // cut to kMaxDeclaredElements (past its bound, it is passed as is:
        // refused before any allocation).
        if (elements > kMaxDeclaredElements &&
            elements <= Client::kMaxTensorElements) {
          elements = kMaxDeclaredElements;
        }
        Check(muonps_client_add_tensor(client_, OrNull(name, Bit(nulls, 0)),
                                       elements, layout));
        return;
      }
      case CAbiCall::kLendCuda: {
        // Before start the pointers are only recorded, never dereferenced.
        const std::string name = in.String(), dtype = in.String();
        const uint64_t grad = in.U64(), param = in.U64();
        Check(muonps_client_lend_cuda(client_, OrNull(name, Bit(nulls, 0)),
                                      grad, param,
                                      OrNull(dtype, Bit(nulls, 1))));
        return;
      }
      case CAbiCall::kExpectDedicated:
        Check(muonps_client_expect_dedicated_workers(client_, in.I32()));
        return;
      case CAbiCall::kSetGroup:
        return SetGroup(nulls, &in);
      case CAbiCall::kStep: {
        const int64_t step = in.I64();
        const double lr = in.Double(), wd = in.Double(), adamw = in.Double();
        muonps_step_result result;
        Check(muonps_client_step(client_, step, lr, wd, adamw,
                                 Bit(nulls, 0) ? nullptr : &result));
        return;
      }
      case CAbiCall::kStepWith:
        return StepWith(nulls, &in);
      case CAbiCall::kWait: {
        muonps_step_result result;
        Check(muonps_client_wait(client_, Bit(nulls, 0) ? nullptr : &result));
        return;
      }
      case CAbiCall::kBuffers: {
        const std::string name = in.String();
        float *param, *grad;
        int64_t elements, row_begin, row_end;
        Check(muonps_client_buffers(client_, OrNull(name, Bit(nulls, 0)),
                                    Bit(nulls, 1) ? nullptr : &param,
                                    Bit(nulls, 2) ? nullptr : &grad,
                                    Bit(nulls, 3) ? nullptr : &elements,
                                    Bit(nulls, 4) ? nullptr : &row_begin,
                                    Bit(nulls, 5) ? nullptr : &row_end));
        return;
      }
      case CAbiCall::kGetAdamW: {
        const std::string name = in.String();
        const int64_t elements = in.I64();
        std::vector<float> avg(Floats(elements)), avg_sq(Floats(elements));
        int64_t steps;
        Check(muonps_client_get_adamw(client_, OrNull(name, Bit(nulls, 0)),
                                      Buffer(&avg, elements, nulls, 1),
                                      Buffer(&avg_sq, elements, nulls, 2),
                                      elements,
                                      Bit(nulls, 3) ? nullptr : &steps));
        return;
      }
      case CAbiCall::kSetAdamW: {
        const std::string name = in.String();
        const int64_t elements = in.I64(), steps = in.I64();
        std::vector<float> avg(Floats(elements)), avg_sq(Floats(elements));
        Check(muonps_client_set_adamw(client_, OrNull(name, Bit(nulls, 0)),
                                      Buffer(&avg, elements, nulls, 1),
                                      Buffer(&avg_sq, elements, nulls, 2),
                                      elements, steps));
        return;
      }
      case CAbiCall::kRefusedBeforeWorker:
        return RefusedBeforeWorker(nulls, &in);
      case CAbiCall::kDestroy:
        muonps_client_destroy(client_);
        client_ = nullptr;
        return;
    }
  }

 private:
  void Check(int code) {
    TraceCall(-1, code, muonps_client_last_error(client_));
  }

  static size_t Floats(int64_t count) {
    return count >= 0 && count <= kMaxFloats ? static_cast<size_t>(count) : 0;
  }

  // `v` (sized for `count` floats) or NULL if asked or `count` is too big.
  static float* Buffer(std::vector<float>* v, int64_t count, int32_t nulls,
                       int bit) {
    if (Bit(nulls, bit) || count < 0 || count > kMaxFloats) return nullptr;
    return v->data();
  }

  void SetGroup(int32_t nulls, ArgReader* in) {
    const int group = in->I32();
    int count = in->I32();
    std::vector<std::string> names;
    for (int i = 0; i < kMaxGroupNames; ++i) names.push_back(in->String());
    std::vector<const char*> pointers;
    for (int i = 0; i < kMaxGroupNames; ++i) {
      pointers.push_back(Bit(nulls, 1 + i) ? nullptr : names[i].c_str());
    }
    // The ABI reads `count` entries: never more than there are.
    if (count > kMaxGroupNames) count = kMaxGroupNames;
    Check(muonps_client_set_group(
        client_, group, Bit(nulls, 0) ? nullptr : pointers.data(), count));
  }

  void StepWith(int32_t nulls, ArgReader* in) {
    const int64_t step = in->I64();
    muonps_step_options options = {};
    options.lr = in->Double();
    options.weight_decay = in->Double();
    options.adamw_lr = in->Double();
    options.group_count = in->I32();
    options.async = in->I32();
    // Every group_* array the ABI reads holds as many entries as the most
    // groups it accepts (MUONPS_MAX_GROUPS), so any group_count in range is
    // backed. A group's four values are read together (zeros past the
    // payload's end), so that the first groups' are all within max_len.
    std::vector<double> lr(MUONPS_MAX_GROUPS), wd(MUONPS_MAX_GROUPS),
        adamw_lr(MUONPS_MAX_GROUPS), adamw_wd(MUONPS_MAX_GROUPS);
    for (int g = 0; g < MUONPS_MAX_GROUPS; ++g) {
      lr[g] = in->Double();
      wd[g] = in->Double();
      adamw_lr[g] = in->Double();
      adamw_wd[g] = in->Double();
    }
    options.group_lr = Bit(nulls, 1) ? nullptr : lr.data();
    options.group_weight_decay = Bit(nulls, 2) ? nullptr : wd.data();
    options.group_adamw_lr = Bit(nulls, 4) ? nullptr : adamw_lr.data();
    options.group_adamw_weight_decay =
        Bit(nulls, 5) ? nullptr : adamw_wd.data();
    muonps_step_result result;
    Check(muonps_client_step_with(client_, step,
                                  Bit(nulls, 0) ? nullptr : &options,
                                  Bit(nulls, 3) ? nullptr : &result));
  }

  // Calls whose work needs a worker or coordinator, with one of the
  // arguments they refuse first set to NULL.
  void RefusedBeforeWorker(int32_t nulls, ArgReader* in) {
    const std::string name = in->String();
    float value = 0;
    const bool name_null = Bit(nulls, 0);
    const char* n = name_null ? nullptr : name.c_str();
    switch (in->I32() & 3) {
      case 0:
        Check(muonps_client_get_momentum(client_, n, in->I64(), nullptr, 1));
        return;
      case 1:
        Check(muonps_client_set_momentum(client_, n, in->I64(), nullptr, 1));
        return;
      case 2:
        if (name_null) {
          Check(muonps_client_set_momentum(client_, nullptr, 0, &value, 1));
        }
        return;
      case 3: {
        const muonps_muon_hyper muon = {};
        const muonps_adamw_hyper adamw = {};
        // Never both: start with both would go to the coordinator.
        const bool with_muon = Bit(nulls, 1);
        Check(muonps_client_start(client_, with_muon ? &muon : nullptr,
                                  with_muon ? nullptr : &adamw));
        return;
      }
    }
  }

  muonps_client* client_ = nullptr;
};

}  // namespace
}  // namespace fuzz
}  // namespace muonps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // gRPC stays initialized across inputs (else every client would start
  // and stop the library: most of an input's time).
  static const bool once = [] {
    grpc_init();
    return true;
  }();
  (void)once;
  (void)muonps_version();
  (void)muonps_abi_version();
  muonps::fuzz::FuzzInput input(data, size);
  muonps::fuzz::CAbiUnderFuzz abi;
  muonps::fuzz::FuzzRecord record;
  while (input.Next(&record)) abi.Run(record);
  return 0;
}
