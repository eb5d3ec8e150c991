#include "newton_schulz/flops.h"

#include <algorithm>

namespace muonps {

double Ns5DenseFlops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return steps * (4 * m * m * n + 2 * m * m * m);
}

double NsExecutedFlops(int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  const double gram = m * m * n;       // X X^T, one triangle
  const double left = 2 * m * m * n;   // Q X, dense
  const double half_cube = m * m * m;  // an m x m product, one triangle
  if (options.algorithm == NsAlgorithm::kNs5) {
    return options.steps * (gram + half_cube + left);
  }
  // Mirrors IterateGram: the same branches, counted instead of run.
  double flops = gram;
  bool q_is_identity = true;
  for (int step = 0; step < options.steps; ++step) {
    flops += half_cube;                      // R^2
    if (!q_is_identity) flops += half_cube;  // Q <- P Q
    q_is_identity = false;
    if (step + 1 == options.steps) break;
    const bool restart =
        std::find(options.gram_restarts.begin(), options.gram_restarts.end(),
                  step + 1) != options.gram_restarts.end();
    if (restart) {
      flops += left + gram;  // X <- Q X0, R <- X X^T
      q_is_identity = true;
    } else {
      flops += 2 * half_cube;  // R <- P R P
    }
  }
  return q_is_identity ? flops : flops + left;
}

}  // namespace muonps
