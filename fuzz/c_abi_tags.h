// Which C ABI call a c_abi_fuzzer record makes (its tag, modulo the
// count): shared by the fuzzer and the seed generator.
#ifndef MUONPS_FUZZ_C_ABI_TAGS_H_
#define MUONPS_FUZZ_C_ABI_TAGS_H_

#include <cstdint>

namespace muonps {
namespace fuzz {

enum class CAbiCall : uint8_t {
  kCreate = 0,
  kAddMatrix,
  kAddTensor,
  kLendCuda,
  kExpectDedicated,
  kSetGroup,
  kStep,
  kStepWith,
  kWait,
  kBuffers,
  kGetAdamW,
  kSetAdamW,
  // get/set_momentum and start with an argument they refuse set to NULL.
  kRefusedBeforeWorker,
  kDestroy,
};
constexpr int kCAbiCallCount = 14;

}  // namespace fuzz
}  // namespace muonps

#endif  // MUONPS_FUZZ_C_ABI_TAGS_H_
