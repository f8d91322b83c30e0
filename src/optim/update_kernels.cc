// Element-wise update kernels (see update_kernels.h).
//
// AdamW follows torch.optim.AdamW's single-tensor implementation (torch 2.x,
// amsgrad off, not fused or foreach) operation by operation:
//   param.mul_(1 - lr * weight_decay)
//   exp_avg.lerp_(grad, 1 - beta1)             # m + w * (g - m) for w < 0.5
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2^t)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1^t))
// torch computes the Python-float scalars in double and rounds each to fp32
// when the CPU kernel takes it; adamScalars does the same. The per-element
// arithmetic is fp32 in the same order, without fused multiply-adds.
#include "src/optim/update_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace squall::optim {

AdamScalars adamScalars(double lr, double beta1, double beta2, double eps, double weightDecay,
                        int64_t t) {
  AdamScalars s;
  const double td = static_cast<double>(t);
  s.decay = static_cast<float>(1.0 - lr * weightDecay);
  s.lerpW = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.oneMinusB2 = static_cast<float>(1.0 - beta2);
  s.bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, td)));
  s.eps = static_cast<float>(eps);
  s.negStep = static_cast<float>(-(lr / (1.0 - std::pow(beta1, td))));
  return s;
}

void adamStep(size_t n, float* __restrict x, float* __restrict m, float* __restrict v,
              const float* __restrict g, const AdamScalars& s) {
  const float decay = s.decay, w = s.lerpW, b2 = s.beta2, omb2 = s.oneMinusB2;
  const float bc2 = s.bc2Sqrt, eps = s.eps, neg = s.negStep;
  // torch's lerp: self + w * (end - self) when |w| < 0.5, else end - (end - self) * (1 - w).
  const bool low = std::fabs(w) < 0.5f;
  const float w1 = 1.0f - w;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = low ? m[i] + w * (gi - m[i]) : gi - (gi - m[i]) * w1;
    const float vi = v[i] * b2 + omb2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2 + eps;
    m[i] = mi;
    v[i] = vi;
    x[i] = x[i] * decay + neg * mi / denom;
  }
}

void momentumStep(size_t n, float* __restrict out, const float* __restrict m,
                  const float* __restrict g, float beta1, float oneMinusB1,
                  const float* __restrict maskBy) {
  if (maskBy == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = beta1 * m[i] + oneMinusB1 * g[i];
    return;
  }
  // x * 1 is x and x * 0 is 0 but NaN for NaN or inf, so the step is still
  // skipped; selecting the factor (not the result) keeps the loop vectorised.
  for (size_t i = 0; i < n; ++i) {
    float factor = 1.0f;
    factor = maskBy[i] > 0.0f ? factor : 0.0f;  // (written so that gcc if-converts it)
    out[i] = (beta1 * m[i] + oneMinusB1 * g[i]) * factor;
  }
}

void scale(size_t n, float* __restrict v, float factor) {
  for (size_t i = 0; i < n; ++i) v[i] = v[i] / factor;
}

float adamRatioBound(double beta1, double beta2) {
  const double rho = beta1 * beta1 / beta2;
  if (!(beta2 > 0.0) || !(rho < 1.0)) return std::numeric_limits<float>::infinity();
  return static_cast<float>((1.0 - beta1) / std::sqrt((1.0 - beta2) * (1.0 - rho)));
}

FrozenScalars frozenScalars(double lr, double beta1, double beta2, double eps, double weightDecay,
                            bool guard, double maxUpdate) {
  FrozenScalars s;
  s.decay = static_cast<float>(1.0 - lr * weightDecay);
  s.negLr = static_cast<float>(-lr);
  s.eps = static_cast<float>(eps);
  s.mask = guard;
  s.bound = !guard            ? std::numeric_limits<float>::infinity()
            : maxUpdate > 0.0 ? static_cast<float>(maxUpdate)
                              : adamRatioBound(beta1, beta2);
  return s;
}

void frozenStep(size_t n, float* __restrict x, const float* __restrict m,
                const float* __restrict vHat, const FrozenScalars& s) {
  const float decay = s.decay, neg = s.negLr, eps = s.eps, hi = s.bound, lo = -s.bound;
  // m is finite here (the caller skips non-finite steps), so the comparisons
  // below are a clip; vHat == 0 with the mask gives r = 0 however large m / eps is.
  const float keep = s.keepAbove();
  for (size_t i = 0; i < n; ++i) {
    float r = m[i] / (std::sqrt(vHat[i]) + eps);
    r = r > hi ? hi : r;
    r = r < lo ? lo : r;
    r = vHat[i] > keep ? r : 0.0f;
    x[i] = x[i] * decay + neg * r;
  }
}

void slowmoStep(size_t n, float* __restrict x, float* __restrict xPrev, float* __restrict u,
                const float* __restrict xAvg, float lr, float alpha, float beta) {
  const float oneMinusAlpha = 1.0f - alpha;
  const float ab = alpha * beta * lr;
  for (size_t i = 0; i < n; ++i) {
    const float d = xPrev[i] - xAvg[i];
    const float uOld = u[i];
    const float next = xAvg[i] + oneMinusAlpha * d - ab * uOld;
    u[i] = beta * uOld + d / lr;
    xPrev[i] = next;
    x[i] = next;
  }
}

void subtract(size_t n, float* out, const float* a, const float* b) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
}

void add(size_t n, float* out, const float* a, const float* b) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

bool allFinite(const float* __restrict p, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

void sumVarianceLanes(const double* partials, double* diff, double* total) {
  double d = 0.0, t = 0.0;
  for (size_t j = 0; j < kVarianceLanes; ++j) {
    d += partials[2 * j];
    t += partials[2 * j + 1];
  }
  *diff = d;
  *total = t;
}

void varianceChange(size_t n, const float* __restrict v, float* __restrict snap, double a, double b,
                    double* diff, double* total) {
  // Walked in index order (sequential memory) into the lanes: the same
  // per-lane order as one device thread per lane with a grid-stride loop.
  std::vector<double> lanes(2 * kVarianceLanes, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const size_t j = i % kVarianceLanes;
    const double now = a * static_cast<double>(v[i]);
    const double then = b * static_cast<double>(snap[i]);
    lanes[2 * j] += std::fabs(now - then);
    lanes[2 * j + 1] += now;
    snap[i] = v[i];
  }
  sumVarianceLanes(lanes.data(), diff, total);
}

}  // namespace squall::optim
