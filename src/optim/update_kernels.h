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

// out = beta1 * m + (1 - beta1) * g (the APMSqueeze local momentum).
void momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                  float oneMinusB1);

// v = v / bc2 (bias-corrected, frozen at the switch).
void scale(size_t n, float* v, float factor);

// x *= decay; x += negLr * m / (sqrt(vHat) + eps).
void frozenStep(size_t n, float* x, const float* m, const float* vHat, float decay, float negLr,
                float eps);

// SlowMo outer step with d = xPrev - xAvg:
//   u = beta * u + d / lr;  x = xPrev = xAvg + (1 - alpha) * d - alpha * beta * lr * uOld.
// Algebraically this is x_prev - alpha * lr * u_new; written this way it is
// exactly xAvg when alpha == 1 and beta == 0 (periodic averaging).
void slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                float alpha, float beta);

// True when no element is NaN or infinite.
bool allFinite(const float* p, size_t n);

}  // namespace squall::optim
