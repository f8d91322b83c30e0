// Element-wise update kernels of the optimizers: AdamW (warmup, sync and
// local modes), the APMSqueeze momentum and frozen-variance update, the
// SlowMo outer update, and a finiteness check.
//
// Every kernel is a plain loop over restrict-qualified fp32 arrays with its
// scalars precomputed by the caller, written so that gcc vectorises it at -O3
// (the library is built with -ffp-contract=off, and this layer with
// -fno-math-errno so that sqrt vectorises). The rounding is that of the
// scalar loop: results do not depend on the vector width, so ranks on
// different CPUs stay bit-identical.
#pragma once

#include <cstddef>
#include <cstdint>

namespace squall::optim {

// The scalars of one AdamW step, in the order torch.optim.AdamW (single-tensor
// path, torch >= 2.0) applies them; see adamStep in update_kernels.cc.
struct AdamScalars {
  float decay;  // 1 - lr * weightDecay (computed in double, rounded once)
  float lerpW;  // 1 - beta1: m.lerp_(g, lerpW)
  float beta2;  // v = v * beta2 + (1 - beta2) * g * g
  float oneMinusB2;
  float bc2Sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float negStep;  // -lr / (1 - beta1^t)
};

AdamScalars adamScalars(double lr, double beta1, double beta2, double eps, double weightDecay,
                        int64_t t);

// x *= decay; m = lerp(m, g, lerpW); v = v * beta2 + (1 - beta2) * g * g;
// x += negStep * m / (sqrt(v) / bc2Sqrt + eps).
void adamStep(size_t n, float* x, float* m, float* v, const float* g, const AdamScalars& s);

// out = beta1 * m + (1 - beta1) * g (the APMSqueeze local momentum). With
// `maskBy` (the frozen v_hat) set, out = 0 where maskBy is 0 (the guard),
// except that a non-finite gradient there still gives NaN, so that the step
// is skipped as for any other element.
void momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                  float oneMinusB1, const float* maskBy);

// v = v / bc2 (bias-corrected, frozen at the switch).
void scale(size_t n, float* v, float factor);

// The largest |m_hat| / sqrt(v_hat) Adam's moments can reach with these
// betas. By Cauchy-Schwarz over the exponential averages,
// |m_t| <= (1 - beta1) / sqrt(1 - beta2) * sqrt(sum_k rho^k) * sqrt(v_t) with
// rho = beta1^2 / beta2; with the bias corrections the factor grows with t
// from 1 (t = 1) to (1 - beta1) / sqrt((1 - beta2) (1 - rho)) (t -> inf),
// which this returns (7.27 for 0.9, 0.999). +infinity when rho >= 1: no
// finite bound exists.
float adamRatioBound(double beta1, double beta2);

// The scalars of one APMSqueeze compressed-stage update.
struct FrozenScalars {
  float decay;  // 1 - lr * weightDecay (computed in double, rounded once)
  float negLr;  // -lr
  float eps;
  float bound;  // r = m / (sqrt(vHat) + eps) is clipped to [-bound, bound] (+inf: no clip)
  bool mask;    // elements with vHat == 0 do not move

  // The kernels keep an element's step where vHat > keepAbove(): always
  // without the mask (vHat >= 0), and only where vHat > 0 with it.
  float keepAbove() const { return mask ? 0.0f : -1.0f; }
};

// guard off: bound = +inf, mask = false; on: mask, and bound = maxUpdate, or
// adamRatioBound(beta1, beta2) when maxUpdate is 0.
FrozenScalars frozenScalars(double lr, double beta1, double beta2, double eps, double weightDecay,
                            bool guard, double maxUpdate);

// r = clip(m / (sqrt(vHat) + eps), -bound, bound), r = 0 where mask and
// vHat == 0; x = x * decay + negLr * r.
void frozenStep(size_t n, float* x, const float* m, const float* vHat, const FrozenScalars& s);

// SlowMo outer step with d = xPrev - xAvg:
//   u = beta * u + d / lr;  x = xPrev = xAvg + (1 - alpha) * d - alpha * beta * lr * uOld.
// Algebraically this is x_prev - alpha * lr * u_new; written this way it is
// exactly xAvg when alpha == 1 and beta == 0 (periodic averaging).
void slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                float alpha, float beta);

// out = a - b and out = a + b (the drift of a compressed SlowMo
// synchronisation); out may be a or b.
void subtract(size_t n, float* out, const float* a, const float* b);
void add(size_t n, float* out, const float* a, const float* b);

// True when no element is NaN or infinite.
bool allFinite(const float* p, size_t n);

// The adaptive warmup's signal (docs/optim.md, "When the warmup ends"): with
// vNow = a * v and vThen = b * snap (a, b: the bias corrections of the two
// moments), diff = sum |vNow - vThen| and total = sum vNow, in double; then
// snap = v. The sums run over kVarianceLanes lanes, lane j taking the
// elements i = j (mod kVarianceLanes) in index order, and the lanes are then
// added in lane order: a fixed order that the device kernel repeats (one
// thread per lane), so the host and the device, and every rank, compute the
// same bits and take the same decision.
constexpr size_t kVarianceLanes = 16384;
void varianceChange(size_t n, const float* v, float* snap, double a, double b, double* diff,
                    double* total);
// Adds per-lane partial sums (diff, total interleaved, 2 * kVarianceLanes
// values) in lane order.
void sumVarianceLanes(const double* partials, double* diff, double* total);

}  // namespace squall::optim
