// Shared by the GPU data-path tests (tests/gpu_step_test.cc,
// tests/gpu_two_workers_test.cc): the matrix set every case lends,
// deterministic gradients and the relative error they are judged by.
#ifndef MUONPS_TESTS_GPU_TEST_SUPPORT_H_
#define MUONPS_TESTS_GPU_TEST_SUPPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muonps {
namespace testing {

inline constexpr absl::Duration kGpuStartTimeout = absl::Seconds(60);

struct MatrixCase {
  std::string name;
  int64_t rows, cols, experts;
};

// Two same-shape matrices (one stack on the owner), a wide, a tall and a
// square one, and a 3-expert stack.
const std::vector<MatrixCase>& Matrices();

// A deterministic gradient value, of varied magnitude and sign.
float GradValue(int64_t step, int matrix, int64_t i);

// ||a - b||_F / ||b||_F in double.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_GPU_TEST_SUPPORT_H_
