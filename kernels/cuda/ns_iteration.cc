#include "kernels/cuda/ns_iteration.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/aol_scaling.h"
#include "kernels/cuda/ns_elementwise.h"
#include "kernels/cuda/symmetric_gemm.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

float PowerOfTwoNear(double v, int max_exponent) {
  const int e =
      std::clamp(static_cast<int>(std::floor(std::log2(v))), 0, max_exponent);
  return std::ldexp(1.0f, e);
}

// Issues the steps of one algorithm; holds what every step needs.
class Issuer {
 public:
  Issuer(cublasHandle_t handle, cudaStream_t stream,
         const NewtonSchulzOptions& options, NsWorkspace* ws)
      : handle_(handle),
        stream_(stream),
        options_(options),
        ws_(ws),
        m_(ws->m()),
        n_(ws->n()),
        count_(ws->count()),
        low_(ws->low()),
        s_(ScalesFor(ws->low(), ws->m(), ws->n())) {}

  absl::Status Normalize(const float* in, float* out32, void* x_low) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        LaunchSumOfSquares(in, count_, m_ * n_, ws_->sums(), stream_));
    MUONPS_CUDA_RETURN_IF_ERROR(LaunchNormalize(
        in, count_, m_ * n_, ws_->sums(), NormalizationMargin(options_),
        options_.eps, out32, x_low, low_, s_.x, stream_));
    return absl::OkStatus();
  }

  // c (lower) <- alpha l r^T + beta c, then `combine` of it (fused into
  // the product where the plan's kernel can).
  absl::Status Product(const void* l, const StackOperand& lo, const void* r,
                       const StackOperand& ro, int64_t k, float alpha,
                       float beta, float* c, const ProductCombine& combine) {
    return LowerProductCombine(handle_, ws_->plan(), low_, count_, m_, k, alpha,
                               lo, ro, beta, c, ws_->Tiles(l, r, c), combine);
  }
  absl::Status GramThen(const void* x, float* c,
                        const ProductCombine& combine) {
    return Product(x, ws_->Wide(x), x, ws_->Wide(x), n_, 1.0f / (s_.x * s_.x),
                   0.0f, c, combine);
  }
  absl::Status SquareThen(const void* l, const void* r, float alpha, float beta,
                          float* c, const ProductCombine& combine) {
    return Product(l, SquareStack(l, m_), r, SquareStack(r, m_), m_, alpha,
                   beta, c, combine);
  }
  // The combine that only mirrors: dst_low <- scale * mirror(product).
  static ProductCombine MirrorTo(void* dst_low, float scale,
                                 unsigned int* unhealthy = nullptr) {
    ProductCombine c;
    c.value_low = dst_low;
    c.value_scale = scale;
    c.unhealthy = unhealthy;
    return c;
  }
  // M = b A + c A^2 from the product A^2 and A in fp32 (`a32`).
  static ProductCombine Polynomial(const float* a32, const NsCoefficients& k,
                                   void* value_low, float scale) {
    ProductCombine c;
    c.other = a32;
    c.coef_other = static_cast<float>(k.b);
    c.coef_product = static_cast<float>(k.c);
    c.keep_product = false;
    c.value_low = value_low;
    c.value_scale = scale;
    return c;
  }

  absl::Status Combine(SymmetricCombine args) {
    args.count = count_;
    args.m = m_;
    args.low_type = low_;
    MUONPS_CUDA_RETURN_IF_ERROR(LaunchSymmetricCombine(args, stream_));
    return absl::OkStatus();
  }
  // dst_low <- scale * mirror(src).
  absl::Status Mirror(const float* src, void* dst_low, float scale,
                      bool check = false) {
    SymmetricCombine args;
    args.a = src;
    args.value_low = dst_low;
    args.value_scale = scale;
    if (check) args.unhealthy = ws_->unhealthy();
    return Combine(args);
  }

  // AOL (NewtonSchulzOptions::aol) after Normalize: a32 (lower) and
  // a_low <- A = X X^T, then X <- S X (fp32 `out` and x_low) and
  // A <- S A S (both copies), so the first step starts from A.
  absl::Status Aol(float* out, float* a32, void* a_low) {
    void* x = ws_->x_low();
    MUONPS_RETURN_IF_ERROR(GramThen(x, a32, MirrorTo(a_low, s_.square)));
    MUONPS_CUDA_RETURN_IF_ERROR(
        LaunchAolScales(a_low, low_, s_.square, count_, m_,
                        NormalizationMargin(options_), ws_->scales(), stream_));
    MUONPS_CUDA_RETURN_IF_ERROR(LaunchScaleRows(out, x, low_, s_.x, count_, m_,
                                                n_, ws_->Wide(x).row_major,
                                                ws_->scales(), stream_));
    MUONPS_CUDA_RETURN_IF_ERROR(
        LaunchScaleSymmetric(a32, count_, m_, ws_->scales(), stream_));
    return Mirror(a32, a_low, s_.square,
                  /*check=*/options_.algorithm == NsAlgorithm::kGram);
  }

  absl::Status Ns5(const float* in, float* out);
  absl::Status GramNs(const float* in, float* out);

 private:
  cublasHandle_t handle_;
  cudaStream_t stream_;
  const NewtonSchulzOptions& options_;
  NsWorkspace* ws_;
  int64_t m_, n_, count_;
  cudaDataType low_;
  NsScales s_;
};

absl::Status Issuer::Ns5(const float* in, float* out) {
  void* x = ws_->x_low();
  float* a32 = ws_->square32(0);
  float* a2 = ws_->square32(1);
  void* a_low = ws_->square_low(0);
  void* b_low = ws_->square_low(1);
  // The fp32 iterate lives in `out`, so the last step writes the result.
  MUONPS_RETURN_IF_ERROR(Normalize(in, out, x));
  if (options_.aol) MUONPS_RETURN_IF_ERROR(Aol(out, a32, a_low));
  for (int step = 0; step < options_.steps; ++step) {
    const NsCoefficients k = CoefficientsForStep(options_, step);
    if (step > 0 || !options_.aol) {
      MUONPS_RETURN_IF_ERROR(GramThen(x, a32, MirrorTo(a_low, s_.square)));
    }
    // B = b A + c A^2.
    MUONPS_RETURN_IF_ERROR(SquareThen(a_low, a_low,
                                      1.0f / (s_.square * s_.square), 0.0f, a2,
                                      Polynomial(a32, k, b_low, s_.square)));
    // X <- a X + B X with X in fp32: the `a` term is the GEMM's beta.
    MUONPS_RETURN_IF_ERROR(LeftMultiply(handle_, low_, CUDA_R_32F, count_, m_,
                                        n_, 1.0f / (s_.square * s_.x), b_low,
                                        ws_->Wide(x), static_cast<float>(k.a),
                                        out, ws_->left_multiply()));
    if (step + 1 < options_.steps) {
      MUONPS_CUDA_RETURN_IF_ERROR(
          LaunchCast(out, count_ * m_ * n_, x, low_, s_.x, stream_));
    }
  }
  return absl::OkStatus();
}

// Q is kept as its constant term c (a product of the steps' `a`, in fp32)
// plus D = Q - c I: D32 in fp32 (updated as D <- a D + M Q, the `a` term as
// the GEMM's beta) and Q = D + c I as a GEMM input. A segment (the steps up
// to a restart, or to the end) may apply X <- c X + D X with X in fp32:
// rounding noise of X's 16-bit copy in directions X does not span
// (rank-deficient or ill-conditioned inputs) then meets D, which is ~0
// there, instead of Q, which would multiply it by c (a^k after k steps).
// That pays in the first segment, which starts far from converged (the
// normalized X has singular values near 1 / sqrt(m) at full rank), and in
// later segments of at most 2 steps. Later, longer segments start from
// converged singular values, where D ~ 1 - c amplifies D's own rounding
// (a CPU emulation of these roundings, Gaussian 64 x 256 in bf16: 31 u
// with D in the 3-step second segment of the default schedule, 12 u with
// Q), so they multiply by Q; their noise in unspanned directions then
// grows by c (a^3 ~ 41), which is why Gram NS with the default single
// restart is 20-40 times less accurate than NS5 in 16-bit on rank-deficient
// inputs. Restarts after steps 1, 3 and 4 (segments of 1, 2, 1 and 1
// steps, all with D) bring that to 2.3-2.6x in the emulation at 6 alpha +
// 4 m^3 multiply-adds against 3 alpha + 7 (alpha = n / m); ns_accuracy_gpu_test
// checks 4x on the GPU. Where D is applied, its 16-bit copy comes out of the
// combine that forms Q (no extra pass).
absl::Status Issuer::GramNs(const float* in, float* out) {
  void* x = ws_->x_low();
  float* r32 = ws_->square32(0);
  float* r2 = ws_->square32(1);
  float* d32 = ws_->square32(2);
  void* r_low = ws_->square_low(0);
  void* m_low = ws_->square_low(1);
  void* t_low = ws_->square_low(3);
  // Q, and the buffer the next P Q goes to (a product never writes an
  // operand it reads).
  void* q_low = ws_->square_low(2);
  void* q_next = ws_->square_low(4);
  unsigned int* check = ws_->unhealthy();
  const float sr = s_.square;
  float constant = 1.0f;
  // Below 64 rows the normalized X starts near converged (singular values
  // near 1 / sqrt(m)), where D ~ 1 - c and its rounding dominates.
  const bool split_allowed = m_ >= 64;
  // Where the segment starting at `step` ends (its restart, or the end).
  const auto segment_end = [&](int step) {
    int end = options_.steps;
    for (const int r : options_.gram_restarts) {
      if (r > step && r < end) end = r;
    }
    return end;
  };
  bool split = split_allowed;
  // D's 16-bit copy and its storage scale, set with D.
  const void* d_low = nullptr;
  float d_scale = 1.0f;
  // X <- Q X in fp32 (in `out`), from X's fp32 copy and its 16-bit twin.
  const auto apply_q = [&]() -> absl::Status {
    if (!split) {
      return LeftMultiply(handle_, low_, CUDA_R_32F, count_, m_, n_,
                          1.0f / (s_.q * s_.x), q_low, ws_->Wide(x), 0.0f, out,
                          ws_->left_multiply());
    }
    return LeftMultiply(handle_, low_, CUDA_R_32F, count_, m_, n_,
                        1.0f / (d_scale * s_.x), d_low, ws_->Wide(x), constant,
                        out, ws_->left_multiply());
  };
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(check, 0, sizeof(unsigned int), stream_));
  MUONPS_RETURN_IF_ERROR(Normalize(in, out, x));
  if (options_.aol) {
    MUONPS_RETURN_IF_ERROR(Aol(out, r32, r_low));
  } else {
    MUONPS_RETURN_IF_ERROR(GramThen(x, r32, MirrorTo(r_low, sr, check)));
  }
  bool q_is_identity = true;
  for (int step = 0; step < options_.steps; ++step) {
    const NsCoefficients k = CoefficientsForStep(options_, step);
    const float a = static_cast<float>(k.a);
    // M = b R + c R^2, so P = a I + M.
    ProductCombine poly = Polynomial(r32, k, m_low, sr);
    const float square_alpha = 1.0f / (sr * sr);
    if (q_is_identity) {
      // Q = P: D = M, c = a.
      poly.value32 = d32;
      poly.diag = a;
      poly.with_diag_low = q_low;
      poly.with_diag_scale = s_.q;
      MUONPS_RETURN_IF_ERROR(
          SquareThen(r_low, r_low, square_alpha, 0.0f, r2, poly));
      constant = a;
      d_low = m_low;
      d_scale = sr;
      q_is_identity = false;
    } else {
      // P Q = a D + M Q + a c I: D <- a D + M Q, c <- a c.
      MUONPS_RETURN_IF_ERROR(
          SquareThen(r_low, r_low, square_alpha, 0.0f, r2, poly));
      constant *= a;
      ProductCombine q;
      q.diag = constant;
      q.with_diag_low = q_next;
      q.with_diag_scale = s_.q;
      if (split) {
        q.value_low = t_low;
        q.value_scale = s_.q;
        d_low = t_low;
        d_scale = s_.q;
      }
      MUONPS_RETURN_IF_ERROR(
          SquareThen(m_low, q_low, 1.0f / (sr * s_.q), a, d32, q));
      std::swap(q_low, q_next);
    }
    if (step + 1 == options_.steps) break;
    const bool restart =
        std::find(options_.gram_restarts.begin(), options_.gram_restarts.end(),
                  step + 1) != options_.gram_restarts.end();
    if (!restart) {
      // R <- P (P R), each product a M + a-term in fp32.
      MUONPS_RETURN_IF_ERROR(
          SquareThen(m_low, r_low, square_alpha, a, r32, MirrorTo(t_low, sr)));
      MUONPS_RETURN_IF_ERROR(SquareThen(m_low, t_low, square_alpha, a, r32,
                                        MirrorTo(r_low, sr, check)));
      continue;
    }
    // X <- Q X, R <- X X^T, Q <- I.
    MUONPS_RETURN_IF_ERROR(apply_q());
    MUONPS_CUDA_RETURN_IF_ERROR(
        LaunchCast(out, count_ * m_ * n_, x, low_, s_.x, stream_));
    MUONPS_RETURN_IF_ERROR(GramThen(x, r32, MirrorTo(r_low, sr, check)));
    q_is_identity = true;
    split = split_allowed && segment_end(step + 1) - (step + 1) <= 2;
  }
  return apply_q();
}

}  // namespace

NsScales ScalesFor(cudaDataType low, int64_t m, int64_t n) {
  NsScales s;
  if (low != CUDA_R_16F) return s;
  // Normalized X has ||X||_F <= 1, so entries are <= 1 and typically
  // 1 / sqrt(m n); R = X X^T has trace <= 1, diagonal entries near 1 / m
  // and off-diagonal ones far smaller. Scaling lifts typical values to
  // about 1/16 and 1, while the largest possible ones stay below fp16's
  // 65504: 2^12 for X, and 2^11 times |b x + c x^2| on [0, 1] for the
  // polynomials (at most 2.8 for the quintic, 8.3 for Polar Express; fp16
  // assumes coefficients with that bound under 32).
  s.x = PowerOfTwoNear(std::sqrt(static_cast<double>(m) * n) / 16, 12);
  s.square = PowerOfTwoNear(static_cast<double>(m), 11);
  return s;
}

absl::Status IssueNewtonSchulz(cublasHandle_t handle, cudaStream_t stream,
                               const float* in, float* out,
                               const NewtonSchulzOptions& options,
                               NsWorkspace* ws) {
  Issuer issuer(handle, stream, options, ws);
  return options.algorithm == NsAlgorithm::kGram ? issuer.GramNs(in, out)
                                                 : issuer.Ns5(in, out);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
