// The optimizers (src/optim) with ranks as threads over the local transport,
// and their C API (include/squall/optim.h) over a one-rank communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "squall/optim.h"
#include "src/optim/optimizer.h"
#include "src/optim/update_kernels.h"
#include "tests/unit/coll_harness.h"

namespace squall {
namespace {

using optim::Config;
using optim::Mode;
using optim::Optimizer;
using optim::Phase;
using testing::Group;

// A deterministic gradient of (rank, step), different on every rank.
std::vector<float> gradient(int rank, int step, size_t count, float scale = 1.0f) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + rank + 7));
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> g(count);
  for (float& x : g) x = dist(rng);
  return g;
}

std::vector<float> initialParams(size_t count) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(count);
  for (float& v : x) v = dist(rng);
  return x;
}

Config apmConfig(int64_t warmup) {
  Config c;
  c.mode = Mode::kApmSqueeze;
  c.lr = 1e-3f;
  c.weightDecay = 0.01f;
  c.warmupSteps = warmup;
  c.codec.block = 256;
  return c;
}

// Bit patterns compared element by element (not memcmp over float*, which
// clang-tidy rejects since a float's object representation is not unique).
bool sameBits(const float* a, const float* b, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Creates one optimizer per rank (on the rank's thread) and runs `steps`
// steps from `first`, with gradient(rank, step); params[r] are updated.
void runSteps(Group& group, std::vector<std::unique_ptr<Optimizer>>& opts,
              std::vector<std::vector<float>>& params, int first, int steps) {
  const size_t count = params[0].size();
  group.run([&](coll::Communicator&, int r) {
    for (int s = first; s < first + steps; ++s) {
      const std::vector<float> g = gradient(r, s, count);
      ASSERT_EQ(opts[r]->step(params[r].data(), g.data(), 0.0f), Status::kOk) << lastError();
    }
  });
}

std::vector<std::unique_ptr<Optimizer>> createAll(Group& group, size_t count, const Config& c) {
  std::vector<std::unique_ptr<Optimizer>> opts(static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r)
    EXPECT_EQ(Optimizer::create(&group.comm(r), count, c, &opts[r]), Status::kOk) << lastError();
  return opts;
}

// The textbook AdamW (Loshchilov & Hutter, as torch.optim.AdamW computes it)
// in double, on the average of the ranks' gradients.
struct ReferenceAdamW {
  std::vector<double> x, m, v;
  double lr, b1, b2, eps, wd;
  int t = 0;
  ReferenceAdamW(const std::vector<float>& x0, const Config& c)
      : x(x0.begin(), x0.end()),
        m(x0.size(), 0.0),
        v(x0.size(), 0.0),
        lr(c.lr),
        b1(c.beta1),
        b2(c.beta2),
        eps(c.eps),
        wd(c.weightDecay) {}
  void step(const std::vector<double>& g) {
    ++t;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      x[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

class WarmupMatchesAdamW : public ::testing::TestWithParam<Mode> {};

TEST_P(WarmupMatchesAdamW, Within1e6) {
  const int n = 3, steps = 20;
  const size_t count = 777;
  Config c = apmConfig(steps);
  c.mode = GetParam();
  Group group(n);
  auto opts = createAll(group, count, c);
  std::vector<std::vector<float>> params(n, initialParams(count));
  ReferenceAdamW ref(params[0], c);
  for (int s = 0; s < steps; ++s) {
    runSteps(group, opts, params, s, 1);
    std::vector<double> avg(count, 0.0);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> g = gradient(r, s, count);
      for (size_t i = 0; i < count; ++i) avg[i] += g[i] / n;
    }
    ref.step(avg);
    double worst = 0;
    for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(params[0][i] - ref.x[i]));
    ASSERT_LE(worst, 1e-6) << "step " << s + 1;
    for (int r = 1; r < n; ++r) ASSERT_TRUE(sameBits(params[0], params[r])) << "rank " << r;
  }
  EXPECT_EQ(opts[0]->info().phase,
            c.mode == Mode::kApmSqueeze ? Phase::kCompressed : Phase::kWarmup);
  EXPECT_EQ(opts[0]->info().step, steps);
  EXPECT_GT(opts[0]->info().bytesSent, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, WarmupMatchesAdamW,
                         ::testing::Values(Mode::kApmSqueeze, Mode::kSync));

TEST(AdamKernel, MatchesTorchOrderOfOperations) {
  // One element through torch's sequence of fp32 operations, written out.
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  float x = 0.5f, m = 0.01f, v = 0.002f;
  const float g = -0.3f;
  const int64_t t = 3;
  const optim::AdamScalars s = optim::adamScalars(lr, b1, b2, eps, wd, t);
  float xk = x, mk = m, vk = v;
  optim::adamStep(1, &xk, &mk, &vk, &g, s);
  x = x * static_cast<float>(1.0 - double{lr} * wd);
  m = m + static_cast<float>(1.0 - double{b1}) * (g - m);
  v = v * b2 + static_cast<float>(1.0 - double{b2}) * g * g;
  const float denom =
      std::sqrt(v) / static_cast<float>(std::sqrt(1.0 - std::pow(double{b2}, 3))) + eps;
  x = x + static_cast<float>(-(double{lr} / (1.0 - std::pow(double{b1}, 3)))) * m / denom;
  EXPECT_EQ(xk, x);
  EXPECT_EQ(mk, m);
  EXPECT_EQ(vk, v);
}

TEST(ApmSqueeze, CompressedStageKeepsRanksBitIdentical) {
  const int n = 4, warmup = 5, steps = 50;
  const size_t count = 3000;
  Group group(n);
  auto opts = createAll(group, count, apmConfig(warmup));
  std::vector<std::vector<float>> params(n, initialParams(count));
  runSteps(group, opts, params, 0, warmup);
  EXPECT_EQ(opts[0]->info().phase, Phase::kCompressed);
  const uint64_t warmupBytes = opts[0]->info().bytesSent;
  const std::vector<float> before = params[0];
  for (int s = warmup; s < warmup + steps; ++s) {
    runSteps(group, opts, params, s, 1);
    for (int r = 1; r < n; ++r) ASSERT_TRUE(sameBits(params[0], params[r])) << "step " << s;
  }
  EXPECT_FALSE(sameBits(before, params[0]));
  for (float x : params[0]) ASSERT_TRUE(std::isfinite(x));
  // Compressed steps send far less than the full-precision warmup did per step.
  const uint64_t compressedBytes = opts[0]->info().bytesSent - warmupBytes;
  EXPECT_GT(compressedBytes, 0u);
  EXPECT_LT(compressedBytes / steps, warmupBytes / warmup / 8);
  EXPECT_EQ(opts[0]->info().skippedSteps, 0u);
}

TEST(SlowMo, AlphaOneBetaZeroIsPeriodicAveraging) {
  const int n = 3, tau = 4, steps = 13;
  const size_t count = 501;
  Config c;
  c.mode = Mode::kLocal;
  c.lr = 1e-2f;
  c.slowmoTau = tau;
  c.slowmoAlpha = 1.0f;
  c.slowmoBeta = 0.0f;
  Config plain = c;
  plain.slowmoTau = 0;
  Group group(n);
  auto slowmo = createAll(group, count, c);
  auto local = createAll(group, count, plain);
  std::vector<std::vector<float>> a(n), b(n);
  for (int r = 0; r < n; ++r) a[r] = b[r] = initialParams(count);
  group.run([&](coll::Communicator& comm, int r) {
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> g = gradient(r, s, count);
      ASSERT_EQ(slowmo[r]->step(a[r].data(), g.data(), 0.0f), Status::kOk);
      ASSERT_EQ(local[r]->step(b[r].data(), g.data(), 0.0f), Status::kOk);
      if ((s + 1) % tau == 0) {
        ASSERT_EQ(comm.allReduce(b[r].data(), b[r].data(), count, DataType::kF32, ReduceOp::kAvg),
                  Status::kOk);
      }
      ASSERT_TRUE(sameBits(a[r], b[r])) << "rank " << r << " step " << s + 1;
    }
  });
  // Step 13 is local: the ranks differ; after step 12 they agreed.
  EXPECT_FALSE(sameBits(a[0], a[1]));
}

TEST(SlowMo, CompressedSyncAgreesAcrossRanks) {
  const int n = 3, tau = 3;
  const size_t count = 900;
  Config c = apmConfig(2);
  c.slowmoTau = tau;
  c.slowmoCompressed = true;
  c.slowmoBeta = 0.5f;
  Group group(n);
  auto opts = createAll(group, count, c);
  std::vector<std::vector<float>> params(n, initialParams(count));
  runSteps(group, opts, params, 0, 3 * tau);
  for (int r = 1; r < n; ++r) EXPECT_TRUE(sameBits(params[0], params[r]));
  for (float x : params[0]) ASSERT_TRUE(std::isfinite(x));
}

// Saves every rank's state after `split` steps, runs on, then restores the
// state into fresh optimizers and checks the rerun is bit-identical.
// *last (optional): rank 0's info at the end.
void checkResume(const Config& c, int n, int split, int more, optim::Info* last = nullptr) {
  const size_t count = 1200;
  Group group(n);
  auto opts = createAll(group, count, c);
  std::vector<std::vector<float>> params(n, initialParams(count));
  runSteps(group, opts, params, 0, split);
  std::vector<std::vector<uint8_t>> blobs(n);
  for (int r = 0; r < n; ++r) {
    blobs[r].resize(opts[r]->stateSize());
    size_t written = 0;
    ASSERT_EQ(opts[r]->saveState(blobs[r].data(), blobs[r].size(), &written), Status::kOk);
    ASSERT_EQ(written, blobs[r].size());
  }
  const std::vector<std::vector<float>> saved = params;
  runSteps(group, opts, params, split, more);

  auto fresh = createAll(group, count, c);
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(fresh[r]->loadState(blobs[r].data(), blobs[r].size()), Status::kOk) << lastError();
  EXPECT_EQ(fresh[0]->info().step, split);
  std::vector<std::vector<float>> again = saved;
  runSteps(group, fresh, again, split, more);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(sameBits(params[r], again[r])) << "rank " << r;
  EXPECT_EQ(fresh[0]->info().phase, opts[0]->info().phase);
  EXPECT_EQ(fresh[0]->info().bytesSent, opts[0]->info().bytesSent);
  EXPECT_EQ(fresh[0]->info().warmupSteps, opts[0]->info().warmupSteps);
  if (last != nullptr) *last = opts[0]->info();
}

TEST(State, ResumeInCompressedPhaseIsBitIdentical) { checkResume(apmConfig(4), 3, 9, 8); }

TEST(State, ResumeAcrossTheSwitchIsBitIdentical) { checkResume(apmConfig(6), 2, 3, 8); }

TEST(State, ResumeWithCompressedSlowMoIsBitIdentical) {
  Config c = apmConfig(3);
  c.slowmoTau = 4;
  c.slowmoCompressed = true;
  checkResume(c, 3, 6, 9);
}

TEST(State, ResumeLocalWithSlowMoIsBitIdentical) {
  Config c;
  c.mode = Mode::kLocal;
  c.slowmoTau = 3;
  checkResume(c, 2, 4, 7);
}

Config adaptiveConfig(int64_t bound, double threshold, int64_t window) {
  Config c = apmConfig(bound);
  c.freezeThreshold = threshold;
  c.freezeWindow = window;
  return c;
}

// Runs n ranks until the step after which every rank froze (or `steps`),
// the ranks' gradients differing; returns each rank's frozen warmup length
// (0: still warming up) and checks the replicas stay bit-identical.
std::vector<int64_t> freezeSteps(const Config& c, int n, size_t count, int steps,
                                 float (*scaleOf)(int step), std::vector<double>* changes) {
  Group group(n);
  auto opts = createAll(group, count, c);
  std::vector<std::vector<float>> params(n, initialParams(count));
  std::vector<int64_t> frozen(n, 0);
  changes->assign(n, -1.0);
  group.run([&](coll::Communicator&, int r) {
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> g = gradient(r, s, count, scaleOf(s));
      ASSERT_EQ(opts[r]->step(params[r].data(), g.data(), 0.0f), Status::kOk) << lastError();
      const optim::Info i = opts[r]->info();
      if (i.phase == Phase::kCompressed && frozen[r] == 0) {
        frozen[r] = i.warmupSteps;
        EXPECT_EQ(i.warmupSteps, s + 1);
        (*changes)[r] = i.varianceChange;
      }
    }
  });
  for (int r = 1; r < n; ++r) EXPECT_TRUE(sameBits(params[0], params[r])) << "rank " << r;
  return frozen;
}

float steady(int) { return 1.0f; }
float growing(int step) { return std::pow(1.5f, static_cast<float>(step)); }

// Stationary gradients: the variance settles, and every rank (each with its
// own gradient) freezes after the same step, a multiple of the window, before
// the bound, with the measured change below the threshold. The count spans
// more than one round of the reduction's lanes.
TEST(AdaptiveWarmup, EveryRankFreezesAfterTheSameStepBeforeTheBound) {
  const Config c = adaptiveConfig(200, 0.1, 4);
  std::vector<double> changes;
  const std::vector<int64_t> frozen =
      freezeSteps(c, 4, optim::kVarianceLanes + 3000, 60, steady, &changes);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(frozen[r], frozen[0]) << "rank " << r;
    EXPECT_EQ(std::bit_cast<uint64_t>(changes[r]), std::bit_cast<uint64_t>(changes[0]));
  }
  EXPECT_GE(frozen[0], 8);  // two windows at least
  EXPECT_LT(frozen[0], 60);
  EXPECT_EQ(frozen[0] % 4, 0);
  EXPECT_GT(changes[0], 0.0);
  EXPECT_LT(changes[0], 0.1);
}

// The first decision comes after two windows; the fixed warmup bounds it;
// gradients whose scale keeps growing never settle, so they run to the
// bound; threshold 0 is the fixed warmup.
TEST(AdaptiveWarmup, FirstDecisionAfterTwoWindowsAndTheBoundHolds) {
  std::vector<double> changes;
  EXPECT_EQ(freezeSteps(adaptiveConfig(30, 100.0, 5), 2, 900, 20, steady, &changes)[0], 10);
  EXPECT_EQ(freezeSteps(adaptiveConfig(13, 1e-12, 4), 2, 900, 20, steady, &changes)[0], 13);
  EXPECT_GT(changes[0], 1e-12);  // measured, never small enough: the bound ended it
  EXPECT_EQ(freezeSteps(adaptiveConfig(24, 0.1, 4), 2, 900, 30, growing, &changes)[0], 24);
  EXPECT_GT(changes[0], 0.1);
  EXPECT_EQ(freezeSteps(adaptiveConfig(7, 0.0, 1), 2, 900, 10, steady, &changes)[0], 7);
}

// The snapshot and its step count are in the state: a resume in the middle of
// a window, before the freeze, freezes after the same step and stays
// bit-identical (without the snapshot the next decision would come later).
TEST(AdaptiveWarmup, ResumeMidWindowIsBitIdentical) {
  optim::Info i;
  checkResume(adaptiveConfig(40, 0.25, 3), 3, 7, 20, &i);
  EXPECT_EQ(i.phase, Phase::kCompressed);
  EXPECT_GT(i.warmupSteps, 7);
  EXPECT_LT(i.warmupSteps, 40);
}

TEST(AdaptiveWarmup, ResumeAfterTheFreezeKeepsItsStep) {
  optim::Info i;
  checkResume(adaptiveConfig(40, 0.25, 3), 2, 25, 6, &i);
  EXPECT_LT(i.warmupSteps, 25);
}

// The optimizer's compressed allreduces choose by bytes (two-phase at 4
// ranks even for a small buffer, where the time model picks the all-gather),
// unless told otherwise.
TEST(ApmSqueeze, CompressedAlgorithmFollowsTheConfig) {
  for (auto [algo, name] : {std::pair{coll::CompressedAlgo::kAutoBytes, "twophase"},
                            std::pair{coll::CompressedAlgo::kAuto, "allgather"},
                            std::pair{coll::CompressedAlgo::kAllGather, "allgather"}}) {
    Config c = apmConfig(1);
    c.compressedAlgo = algo;
    Group group(4);
    auto opts = createAll(group, 3000, c);
    std::vector<std::vector<float>> params(4, initialParams(3000));
    runSteps(group, opts, params, 0, 3);
    EXPECT_STREQ(opts[0]->momentumState()->lastStats().algorithm, name);
  }
}

// The bf16 / fp16 warmup: every rank's replica stays bit-identical, the
// warmup sends about half the bytes of the fp32 ring, the parameters stay
// close to the fp32 warmup's, and (stateless) a resume in the middle of the
// warmup is bit-identical.
TEST(ApmSqueeze, HalfPrecisionWarmupHalvesItsBytes) {
  const size_t count = 4000;
  auto run = [&](codec::CodecId wc, std::vector<std::vector<float>>* params) {
    Config c = apmConfig(6);
    c.warmupCodec = wc;
    Group group(4);
    auto opts = createAll(group, count, c);
    params->assign(4, initialParams(count));
    runSteps(group, opts, *params, 0, 6);
    for (int r = 1; r < 4; ++r) EXPECT_TRUE(sameBits((*params)[0], (*params)[r]));
    return opts[0]->info().bytesSent;
  };
  std::vector<std::vector<float>> full, half;
  const uint64_t fullBytes = run(codec::CodecId::kNone, &full);
  for (codec::CodecId wc : {codec::CodecId::kBf16, codec::CodecId::kFp16}) {
    const uint64_t halfBytes = run(wc, &half);
    EXPECT_LT(halfBytes, fullBytes * 55 / 100);
    EXPECT_GT(halfBytes, fullBytes * 45 / 100);
    double worst = 0.0;
    for (size_t i = 0; i < count; ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(half[0][i] - full[0][i])));
    EXPECT_GT(worst, 0.0);   // the rounding is there ...
    EXPECT_LT(worst, 1e-3);  // ... and small: 6 steps of lr 1e-3 move x by 6e-3 at most
  }
  Config c = apmConfig(8);
  c.warmupCodec = codec::CodecId::kBf16;
  checkResume(c, 3, 3, 8);
  c.warmupCodec = codec::CodecId::kInt8;
  int64_t w = 0;
  EXPECT_EQ(optim::validateConfig(c, &w), Status::kInvalidArgument);
}

// A version 1 blob (the v2 header without its last 40 bytes) still loads:
// made here from a v2 blob of a fixed-warmup optimizer in the compressed
// phase, it resumes bit-identically and reports the fixed warmup's length.
std::vector<uint8_t> asVersion1(const std::vector<uint8_t>& v2) {
  constexpr size_t kPrefix = 24, kHeaderV1 = 112, kV2Fields = 40;
  // One allocation and two copies (gcc 12 at -O2 misreads a growing insert
  // here as out of bounds).
  const size_t head = kPrefix + kHeaderV1;
  if (v2.size() < head + kV2Fields + 8) return {};  // not a v2 blob: the load must fail
  const size_t tail = v2.size() - 8 - head - kV2Fields;
  std::vector<uint8_t> v1(head + tail);
  std::memcpy(v1.data(), v2.data(), head);
  std::memcpy(v1.data() + head, v2.data() + head + kV2Fields, tail);
  const uint32_t version = 1;
  std::memcpy(v1.data() + 8, &version, sizeof(version));
  const uint64_t total = v1.size() + 8;
  std::memcpy(v1.data() + 16, &total, sizeof(total));
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64, as state_blob.cc
  for (uint8_t b : v1) {
    h ^= b;
    h *= 1099511628211ull;
  }
  v1.resize(v1.size() + 8);
  std::memcpy(v1.data() + v1.size() - 8, &h, sizeof(h));
  return v1;
}

TEST(State, Version1BlobsStillLoad) {
  const size_t count = 1200;
  const Config c = apmConfig(4);
  Group group(2);
  auto opts = createAll(group, count, c);
  std::vector<std::vector<float>> params(2, initialParams(count));
  runSteps(group, opts, params, 0, 9);
  std::vector<std::vector<uint8_t>> blobs(2);
  for (int r = 0; r < 2; ++r) {
    std::vector<uint8_t> v2(opts[r]->stateSize());
    size_t written = 0;
    ASSERT_EQ(opts[r]->saveState(v2.data(), v2.size(), &written), Status::kOk);
    blobs[r] = asVersion1(v2);
  }
  const auto saved = params;
  runSteps(group, opts, params, 9, 5);
  auto fresh = createAll(group, count, c);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(fresh[r]->loadState(blobs[r].data(), blobs[r].size()), Status::kOk) << lastError();
  EXPECT_EQ(fresh[0]->info().phase, Phase::kCompressed);
  EXPECT_EQ(fresh[0]->info().warmupSteps, 4);
  auto again = saved;
  runSteps(group, fresh, again, 9, 5);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(sameBits(params[r], again[r])) << "rank " << r;
  // Version 3 does not exist yet: refused.
  std::vector<uint8_t> bad = blobs[0];
  const uint32_t three = 3;
  std::memcpy(bad.data() + 8, &three, sizeof(three));
  EXPECT_EQ(fresh[0]->loadState(bad.data(), bad.size()), Status::kCorruptData);
}

TEST(AdaptiveWarmup, BadSettingsAreRejected) {
  int64_t w = 0;
  Config c = adaptiveConfig(10, -0.5, 4);
  EXPECT_EQ(optim::validateConfig(c, &w), Status::kInvalidArgument);
  c = adaptiveConfig(10, std::numeric_limits<double>::quiet_NaN(), 4);
  EXPECT_EQ(optim::validateConfig(c, &w), Status::kInvalidArgument);
  c = adaptiveConfig(10, 0.1, 0);
  EXPECT_EQ(optim::validateConfig(c, &w), Status::kInvalidArgument);
  EXPECT_NE(std::string(lastError()).find("freezeWindow"), std::string::npos) << lastError();
}

TEST(State, OtherRankCountResetsTheServerResidualWithAWarning) {
  const size_t count = 2000;
  const Config c = apmConfig(2);
  std::vector<std::vector<uint8_t>> blobs(4);
  std::vector<std::vector<float>> workers(4);
  {
    Group group(4);
    auto opts = createAll(group, count, c);
    std::vector<std::vector<float>> params(4, initialParams(count));
    runSteps(group, opts, params, 0, 6);
    for (int r = 0; r < 4; ++r) {
      blobs[r].resize(opts[r]->stateSize());
      size_t written = 0;
      ASSERT_EQ(opts[r]->saveState(blobs[r].data(), blobs[r].size(), &written), Status::kOk);
      const float* w = opts[r]->momentumState()->worker().current();
      workers[r].assign(w, w + count);
      bool nonzero = false;
      for (float x : workers[r]) nonzero = nonzero || x != 0.0f;
      EXPECT_TRUE(nonzero);
    }
  }
  Group group(2);
  auto opts = createAll(group, count, c);
  for (int r = 0; r < 2; ++r) {
    ::testing::internal::CaptureStderr();
    ASSERT_EQ(opts[r]->loadState(blobs[r].data(), blobs[r].size()), Status::kOk) << lastError();
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("server residual reset: saved with 4 ranks, loading into 2"),
              std::string::npos)
        << log;
    coll::CompressedState* s = opts[r]->momentumState();
    for (size_t i = 0; i < s->chunk(); ++i) ASSERT_EQ(s->server().current()[i], 0.0f);
    EXPECT_TRUE(sameBits(s->worker().current(), workers[r].data(), count));
    EXPECT_EQ(opts[r]->info().step, 6);
    EXPECT_EQ(opts[r]->info().phase, Phase::kCompressed);
  }
  // And it keeps training in step.
  std::vector<std::vector<float>> params(2, initialParams(count));
  runSteps(group, opts, params, 6, 5);
  EXPECT_TRUE(sameBits(params[0], params[1]));
}

TEST(State, CorruptTruncatedAndMismatchedBlobsAreRejected) {
  const size_t count = 300;
  Config c = apmConfig(2);
  c.slowmoTau = 2;
  Group group(1);
  auto opts = createAll(group, count, c);
  std::vector<std::vector<float>> params(1, initialParams(count));
  runSteps(group, opts, params, 0, 3);
  std::vector<uint8_t> blob(opts[0]->stateSize());
  size_t written = 0;
  ASSERT_EQ(opts[0]->saveState(blob.data(), blob.size(), &written), Status::kOk);
  size_t small = 0;
  EXPECT_EQ(opts[0]->saveState(blob.data(), blob.size() - 1, &small), Status::kInvalidArgument);

  std::unique_ptr<Optimizer> target;
  ASSERT_EQ(Optimizer::create(&group.comm(0), count, c, &target), Status::kOk);
  for (size_t len = 0; len < blob.size(); len += (len < 200 ? 1 : 97))
    ASSERT_EQ(target->loadState(blob.data(), len), Status::kCorruptData) << "length " << len;
  std::vector<uint8_t> longer = blob;
  longer.push_back(0);
  EXPECT_EQ(target->loadState(longer.data(), longer.size()), Status::kCorruptData);
  for (size_t at = 0; at < blob.size(); at += 13) {
    std::vector<uint8_t> bad = blob;
    bad[at] ^= 0x20;
    ASSERT_EQ(target->loadState(bad.data(), bad.size()), Status::kCorruptData) << "byte " << at;
  }
  EXPECT_EQ(target->info().step, 0);  // nothing was half-loaded
  EXPECT_EQ(target->loadState(blob.data(), blob.size()), Status::kOk) << lastError();
  EXPECT_EQ(target->info().step, 3);

  std::unique_ptr<Optimizer> other;
  ASSERT_EQ(Optimizer::create(&group.comm(0), count + 1, c, &other), Status::kOk);
  EXPECT_EQ(other->loadState(blob.data(), blob.size()), Status::kInvalidUsage);
  EXPECT_NE(lastError().find("saved for 300 parameters"), std::string::npos) << lastError();
  Config sync = c;
  sync.mode = Mode::kSync;
  ASSERT_EQ(Optimizer::create(&group.comm(0), count, sync, &other), Status::kOk);
  EXPECT_EQ(other->loadState(blob.data(), blob.size()), Status::kInvalidUsage);
  Config noSlowmo = c;
  noSlowmo.slowmoTau = 0;
  ASSERT_EQ(Optimizer::create(&group.comm(0), count, noSlowmo, &other), Status::kOk);
  EXPECT_EQ(other->loadState(blob.data(), blob.size()), Status::kInvalidUsage);
}

// Elements whose gradient is always zero. Whole codec blocks of them decode
// to exact zeros, so they stay put with or without the guard; scattered ones
// get the block's +-scale from the 1-bit code and, with v_hat = 0, a step of
// lr * scale / eps: the guard's mask is what keeps them still.
void runWithZeroGradients(const Config& c, const std::vector<size_t>& zeros,
                          std::vector<std::vector<float>>* params) {
  const int n = 3;
  const size_t count = 2000;
  Group group(n);
  auto opts = createAll(group, count, c);
  params->assign(n, initialParams(count));
  group.run([&](coll::Communicator&, int r) {
    for (int s = 0; s < 20; ++s) {
      std::vector<float> g = gradient(r, s, count);
      for (size_t i : zeros) g[i] = 0.0f;
      ASSERT_EQ(opts[r]->step((*params)[r].data(), g.data(), 0.0f), Status::kOk);
    }
  });
  for (int r = 1; r < n; ++r) EXPECT_TRUE(sameBits((*params)[0], (*params)[r]));
}

size_t movedCount(const std::vector<float>& now, const std::vector<float>& start,
                  const std::vector<size_t>& which) {
  size_t moved = 0;
  for (size_t i : which) moved += now[i] != start[i] ? 1 : 0;
  return moved;
}

TEST(ApmSqueeze, AlwaysZeroGradientsDoNotMoveTheirParameters) {
  Config c = apmConfig(3);
  c.weightDecay = 0.0f;
  const std::vector<float> start = initialParams(2000);
  std::vector<size_t> blocks(768), scattered;  // three whole codec blocks of 256; every 7th
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = i;
  for (size_t i = 800; i < 2000; i += 7) scattered.push_back(i);
  std::vector<size_t> others;
  for (size_t i = 768; i < 2000; ++i)
    if ((i - 800) % 7 != 0 || i < 800) others.push_back(i);

  for (int variant = 0; variant < 3; ++variant) {
    const bool guard = variant != 1;
    SCOPED_TRACE(variant == 0 ? "guard on" : variant == 1 ? "guard off" : "adaptive warmup");
    c.guard = guard;
    if (variant == 2) {  // freezes after step 2 of the bound's 3: still nothing moves
      c.warmupSteps = 12;
      c.freezeThreshold = 100.0;
      c.freezeWindow = 1;
    }
    std::vector<std::vector<float>> p;
    std::vector<size_t> zeros = blocks;
    zeros.insert(zeros.end(), scattered.begin(), scattered.end());
    runWithZeroGradients(c, zeros, &p);
    EXPECT_EQ(movedCount(p[0], start, blocks), 0u);
    EXPECT_EQ(movedCount(p[0], start, others), others.size());
    if (guard) {
      EXPECT_EQ(movedCount(p[0], start, scattered), 0u);
    } else {
      // Without the mask they take steps of lr * scale / eps.
      EXPECT_EQ(movedCount(p[0], start, scattered), scattered.size());
      float far = 0.0f;
      for (size_t i : scattered) far = std::max(far, std::fabs(p[0][i] - start[i]));
      EXPECT_GT(far, 1.0f);
    }
  }
}

// adamRatioBound really bounds Adam: |m_hat| / sqrt(v_hat) of the textbook
// recursion (double) never exceeds it, for random and adversarial gradient
// sequences, and comes close to it for the worst case (a long run of one
// sign with geometrically growing magnitude).
TEST(ApmSqueeze, AdamRatioBoundBoundsAdam) {
  EXPECT_NEAR(optim::adamRatioBound(0.9, 0.999), 7.2703, 1e-3);
  EXPECT_TRUE(std::isinf(optim::adamRatioBound(0.99, 0.9)));  // beta1^2 >= beta2
  EXPECT_TRUE(std::isinf(optim::adamRatioBound(0.5, 0.0)));
  for (const auto& [b1, b2] : {std::pair{0.9, 0.999}, {0.8, 0.99}, {0.5, 0.9}, {0.0, 0.999}}) {
    const double bound = optim::adamRatioBound(b1, b2);
    std::mt19937 rng(3);
    std::normal_distribution<double> normal;
    double worst = 0.0;
    const int period = b1 > 0.0 ? static_cast<int>(100.0 / std::log10(b2 / b1)) : 1;
    for (int kind = 0; kind < 3; ++kind) {
      double m = 0.0, v = 0.0;
      for (int t = 1; t <= 20000; ++t) {
        double g = normal(rng);
        if (kind == 1) g = t % 5000 == 0 ? 1e3 : 1e-6;  // rare spikes after silence
        // The Cauchy-Schwarz equality case: g growing like (beta2 / beta1)^t,
        // restarted before it overflows (beta1 = 0: a spike, as kind 1).
        if (kind == 2 && b1 > 0.0) g = std::pow(b2 / b1, t % period);
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        const double ratio =
            std::fabs(m / (1.0 - std::pow(b1, t))) / std::sqrt(v / (1.0 - std::pow(b2, t)));
        ASSERT_LE(ratio, bound * (1.0 + 1e-9)) << b1 << " " << b2 << " kind " << kind;
        worst = std::max(worst, ratio);
      }
    }
    EXPECT_GT(worst, 0.9 * bound) << b1 << " " << b2;
  }
}

// Elements with a tiny but nonzero variance (rarely active inputs) get the
// block's 1-bit scale after the switch: the clip keeps their steps within
// lr * adamRatioBound, where the plain update moves them by lr * scale /
// sqrt(v_hat).
TEST(ApmSqueeze, GuardClipsStepsOfTinyVarianceElements) {
  const int n = 2, warmup = 3;
  const size_t count = 1024;
  for (bool guard : {true, false}) {
    SCOPED_TRACE(guard ? "guard on" : "guard off");
    Config c = apmConfig(warmup);
    c.weightDecay = 0.0f;
    c.guard = guard;
    Group group(n);
    auto opts = createAll(group, count, c);
    std::vector<std::vector<float>> p(n, initialParams(count));
    float largest = 0.0f;  // the largest single step of a tiny-variance element
    group.run([&](coll::Communicator&, int r) {
      for (int s = 0; s < 12; ++s) {
        std::vector<float> g = gradient(r, s, count);
        for (size_t i = 1; i < count; i += 5) g[i] *= 1e-6f;
        const std::vector<float> before = p[r];
        ASSERT_EQ(opts[r]->step(p[r].data(), g.data(), 0.0f), Status::kOk);
        if (r == 0 && s >= warmup)
          for (size_t i = 1; i < count; i += 5)
            largest = std::max(largest, std::fabs(p[r][i] - before[i]));
      }
    });
    const float cap = c.lr * optim::adamRatioBound(c.beta1, c.beta2);
    if (guard) {
      EXPECT_LE(largest, cap * (1.0f + 1e-5f));
      EXPECT_GT(largest, 0.5f * cap);  // the clip is what acted
    } else {
      EXPECT_GT(largest, 100.0f * cap);
    }
    EXPECT_TRUE(sameBits(p[0], p[1]));
  }
}

// A rank that passes a bad argument to its step tells the others, who fail
// their step at once (not after the 30 s deadline) without changing their
// state; every rank then goes on in step, bit-identical. In the warmup and in
// the compressed stage.
TEST(ApmSqueeze, ARanksBadStepArgumentFailsThePeersStepAtOnce) {
  const int n = 3;
  const size_t count = 1000;
  Group group(n);
  auto opts = createAll(group, count, apmConfig(3));
  std::vector<std::vector<float>> p(n, initialParams(count));
  runSteps(group, opts, p, 0, 1);
  for (int bad : {1, 4}) {  // a warmup step, then a compressed one (the switch is after step 3)
    SCOPED_TRACE("bad step " + std::to_string(bad));
    EXPECT_EQ(opts[0]->info().phase, bad == 1 ? Phase::kWarmup : Phase::kCompressed);
    std::vector<Status> status(n);
    std::vector<std::string> message(n);
    std::vector<std::vector<float>> before = p;
    const auto begin = std::chrono::steady_clock::now();
    group.run([&](coll::Communicator&, int r) {
      const std::vector<float> g = gradient(r, bad, count);
      clearLastError();
      status[r] = opts[r]->step(p[r].data(), r == 1 ? nullptr : g.data(), 0.0f);
      message[r] = lastError();
    });
    EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(3)) << "a rank hung";
    EXPECT_EQ(status[1], Status::kInvalidArgument);
    for (int r : {0, 2}) {
      EXPECT_EQ(status[r], Status::kRemoteError) << message[r];
      EXPECT_NE(message[r].find("rank 1"), std::string::npos) << message[r];
      EXPECT_TRUE(sameBits(p[r], before[r]));
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(opts[r]->info().step, bad);  // not counted
    runSteps(group, opts, p, bad, 3);                                  // and on, in step
    for (int r = 1; r < n; ++r) EXPECT_TRUE(sameBits(p[0], p[r]));
  }
}

// Device buffers given to a host optimizer (stepOnStream) are a bad argument
// like any other: that rank gets kInvalidUsage, its peers fail at once, and
// every rank goes on in step.
TEST(ApmSqueeze, AStepOnStreamOfAHostOptimizerIsRefusedToEveryRank) {
  const int n = 3;
  const size_t count = 600;
  Group group(n);
  auto opts = createAll(group, count, apmConfig(2));
  std::vector<std::vector<float>> p(n, initialParams(count));
  runSteps(group, opts, p, 0, 1);
  EXPECT_FALSE(opts[0]->onDevice());
  std::vector<Status> status(n);
  std::vector<std::string> message(n);
  const std::vector<std::vector<float>> before = p;
  const auto begin = std::chrono::steady_clock::now();
  group.run([&](coll::Communicator&, int r) {
    const std::vector<float> g = gradient(r, 1, count);
    clearLastError();
    status[r] = r == 2 ? opts[r]->stepOnStream(p[r].data(), g.data(), 0.0f, nullptr)
                       : opts[r]->step(p[r].data(), g.data(), 0.0f);
    message[r] = lastError();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(3)) << "a rank hung";
  EXPECT_EQ(status[2], Status::kInvalidUsage) << message[2];
  EXPECT_NE(message[2].find("host memory"), std::string::npos) << message[2];
  for (int r : {0, 1}) {
    EXPECT_EQ(status[r], Status::kRemoteError) << message[r];
    EXPECT_NE(message[r].find("rank 2"), std::string::npos) << message[r];
    EXPECT_TRUE(sameBits(p[r], before[r]));
    EXPECT_EQ(opts[r]->info().step, 1);
  }
  runSteps(group, opts, p, 1, 3);
  for (int r = 1; r < n; ++r) EXPECT_TRUE(sameBits(p[0], p[r]));
}

// A rank's non-finite gradient skips the step on every rank, in the warmup
// (the averaged gradient is non-finite everywhere) and in the compressed stage
// (the reduced momentum is).
TEST(ApmSqueeze, NonFiniteGradientSkipsTheStepOnEveryRank) {
  const int n = 3, warmup = 3;
  const size_t count = 1500;
  const Config c = apmConfig(warmup);
  Group group(n);
  auto a = createAll(group, count, c);
  std::vector<std::vector<float>> pa(n, initialParams(count));
  group.run([&](coll::Communicator&, int r) {
    for (int s = 0; s < 12; ++s) {
      const std::vector<float> g = gradient(r, s, count);
      // Poisoned calls: one in the warmup (inf on rank 2), one compressed (NaN on rank 1).
      if (s == 1 || s == 7) {
        std::vector<float> bad = g;
        if (s == 1 && r == 2) bad[10] = std::numeric_limits<float>::infinity();
        if (s == 7 && r == 1) bad[1000] = std::numeric_limits<float>::quiet_NaN();
        const std::vector<float> before = pa[r];
        ASSERT_EQ(a[r]->step(pa[r].data(), bad.data(), 0.0f), Status::kOk);
        ASSERT_TRUE(sameBits(before, pa[r])) << "rank " << r << " moved on a skipped step";
      }
      ASSERT_EQ(a[r]->step(pa[r].data(), g.data(), 0.0f), Status::kOk);
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(a[r]->info().skippedSteps, 2u) << "rank " << r;
    EXPECT_EQ(a[r]->info().step, 14);
    EXPECT_TRUE(sameBits(pa[r], pa[0]));
  }
  for (float x : pa[0]) ASSERT_TRUE(std::isfinite(x));
}

// The compressed skip leaves no trace: m, x and the residuals are as before,
// so the run continues exactly like one that never made that call.
TEST(ApmSqueeze, CompressedSkipLeavesNoTrace) {
  const int n = 3, warmup = 2;
  const size_t count = 1500;
  const Config c = apmConfig(warmup);
  Group group(n);
  auto a = createAll(group, count, c);
  auto b = createAll(group, count, c);
  std::vector<std::vector<float>> pa(n, initialParams(count)), pb(n, initialParams(count));
  group.run([&](coll::Communicator&, int r) {
    for (int s = 0; s < 10; ++s) {
      const std::vector<float> g = gradient(r, s, count);
      if (s == 5) {
        std::vector<float> bad = g;
        if (r == 0) bad[3] = std::numeric_limits<float>::quiet_NaN();
        ASSERT_EQ(a[r]->step(pa[r].data(), bad.data(), 0.0f), Status::kOk);
      }
      ASSERT_EQ(a[r]->step(pa[r].data(), g.data(), 0.0f), Status::kOk);
      ASSERT_EQ(b[r]->step(pb[r].data(), g.data(), 0.0f), Status::kOk);
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(sameBits(pa[r], pb[r])) << "rank " << r;
    EXPECT_EQ(a[r]->info().skippedSteps, 1u);
    EXPECT_TRUE(sameBits(a[r]->momentumState()->worker().current(),
                         b[r]->momentumState()->worker().current(), count));
  }
}

// ---- The C API ----------------------------------------------------------------

#define EXPECT_OK(call) EXPECT_EQ((call), squallSuccess) << squallGetLastError()

class OptimApi : public ::testing::Test {
 protected:
  void SetUp() override {
    squallUniqueId id;
    ASSERT_EQ(squallGetUniqueId(&id), squallSuccess) << squallGetLastError();
    squallConfig_t c = SQUALL_CONFIG_INIT;
    c.timeoutSeconds = 20;
    ASSERT_EQ(squallCommInitRank(&comm_, 1, id, 0, &c), squallSuccess) << squallGetLastError();
  }
  void TearDown() override { squallCommDestroy(comm_); }

  // Expects create to fail with `result` and a last error mentioning `words`.
  void expectRejected(const squallOptimConfig_t& c, squallResult_t result, const char* words) {
    squallOptimizer_t o = nullptr;
    EXPECT_EQ(squallOptimizerCreate(comm_, 10, &c, &o), result);
    EXPECT_EQ(o, nullptr);
    EXPECT_NE(std::string(squallGetLastError()).find(words), std::string::npos)
        << squallGetLastError();
  }

  static squallOptimConfig_t valid() {
    squallOptimConfig_t c = SQUALL_OPTIM_CONFIG_INIT;
    c.totalSteps = 100;
    return c;
  }

  squallComm_t comm_ = nullptr;
};

// The defaults the convergence study chose (docs/convergence.md): 1-bit
// momentum in 64-element blocks with the norm-keeping (RMS) scale, the
// adaptive bf16 warmup bounded by 15% of the run.
TEST(OptimDefaults, AreTheStudysChoice) {
  const squallOptimConfig_t c = SQUALL_OPTIM_CONFIG_INIT;
  EXPECT_EQ(c.codec.codec, squallCodecOnebit);
  EXPECT_EQ(c.codec.scale, squallScaleRms);
  EXPECT_EQ(c.codec.blockSize, 64u);
  EXPECT_EQ(c.warmupCodec, squallCodecBf16);
  EXPECT_EQ(c.freezeThreshold, 0.2);
  EXPECT_EQ(c.warmupFraction, 0.15);
  EXPECT_EQ(c.compressedAlgo, squallOptimAlgoBytes);
}

TEST_F(OptimApi, BadConfigsAreRejectedWithClearErrors) {
  squallOptimConfig_t c = valid();
  c.lr = 0.0f;
  expectRejected(c, squallInvalidArgument, "learning rate");
  c = valid();
  c.lr = -1.0f;
  expectRejected(c, squallInvalidArgument, "learning rate");
  c = valid();
  c.beta1 = 1.0f;
  expectRejected(c, squallInvalidArgument, "beta1");
  c = valid();
  c.beta2 = -0.1f;
  expectRejected(c, squallInvalidArgument, "beta2");
  c = valid();
  c.totalSteps = 0;  // warmupSteps -1: the fraction needs totalSteps
  expectRejected(c, squallInvalidArgument, "totalSteps");
  c = valid();
  c.codec.codec = static_cast<squallCodec_t>(42);
  expectRejected(c, squallInvalidArgument, "codec");
  c = valid();
  c.codec.blockSize = 3;
  expectRejected(c, squallInvalidArgument, "block");
  c = valid();
  c.mode = static_cast<squallOptimMode_t>(7);
  expectRejected(c, squallInvalidArgument, "mode");
  c = valid();
  c.size = 3;
  expectRejected(c, squallInvalidArgument, "size");
  c = valid();
  c.guard = 2;
  expectRejected(c, squallInvalidArgument, "guard");
  c = valid();
  c.maxUpdate = -1.0f;
  expectRejected(c, squallInvalidArgument, "maxUpdate");
  c = valid();
  c.maxUpdate = std::numeric_limits<float>::infinity();
  expectRejected(c, squallInvalidArgument, "maxUpdate");
  // A caller built before the guard fields existed passes a shorter size: the
  // fields past it are not read (here invalid values), and take their defaults.
  c = valid();
  c.size = offsetof(squallOptimConfig_t, guard);
  c.guard = 7;
  c.maxUpdate = -3.0f;
  squallOptimizer_t old = nullptr;
  ASSERT_EQ(squallOptimizerCreate(comm_, 10, &c, &old), squallSuccess) << squallGetLastError();
  EXPECT_EQ(squallOptimizerDestroy(old), squallSuccess);
  c = valid();
  c.slowmoTau = 2;
  c.slowmoBeta = 1.0f;
  expectRejected(c, squallInvalidArgument, "slowmoBeta");
  squallOptimizer_t o = nullptr;
  EXPECT_EQ(squallOptimizerCreate(nullptr, 10, &c, &o), squallInvalidArgument);
  EXPECT_EQ(squallOptimizerCreate(comm_, 10, nullptr, &o), squallInvalidArgument);
}

// A learning-rate override that is not a number is refused like an infinite
// one, and the refused step leaves the parameters and the step count alone.
TEST_F(OptimApi, NonFiniteLearningRateOverridesAreRefused) {
  squallOptimConfig_t c = valid();
  squallOptimizer_t o = nullptr;
  ASSERT_EQ(squallOptimizerCreate(comm_, 10, &c, &o), squallSuccess) << squallGetLastError();
  std::vector<float> params(10, 1.0f), grads(10, 0.5f);
  for (float lr : {std::nanf(""), std::numeric_limits<float>::infinity(),
                   -std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(squallOptimizerStep(o, params.data(), grads.data(), lr), squallInvalidArgument)
        << "lr " << lr;
    EXPECT_NE(std::string(squallGetLastError()).find("learning rate"), std::string::npos)
        << squallGetLastError();
    EXPECT_EQ(params, std::vector<float>(10, 1.0f)) << "lr " << lr;
  }
  squallOptimInfo_t info;
  ASSERT_EQ(squallOptimizerGetInfo(o, &info), squallSuccess);
  EXPECT_EQ(info.step, 0);
  EXPECT_OK(squallOptimizerStep(o, params.data(), grads.data(), 0.0f));
  EXPECT_OK(squallOptimizerDestroy(o));
}

TEST_F(OptimApi, StepInfoSaveAndLoad) {
  squallOptimConfig_t c = valid();  // warmup = round(0.15 * 100) = 15
  squallOptimizer_t o = nullptr;
  const size_t count = 100;
  ASSERT_EQ(squallOptimizerCreate(comm_, count, &c, &o), squallSuccess) << squallGetLastError();
  std::vector<float> x = initialParams(count);
  for (int s = 0; s < 20; ++s) {
    const std::vector<float> g = gradient(0, s, count);
    EXPECT_OK(squallOptimizerStep(o, x.data(), g.data(), s == 19 ? 5e-4f : 0.0f));
  }
  EXPECT_EQ(squallOptimizerStep(o, x.data(), x.data(), 0.0f), squallInvalidArgument);
  EXPECT_EQ(squallOptimizerStep(o, nullptr, x.data(), 0.0f), squallInvalidArgument);
  squallOptimInfo_t info;
  EXPECT_OK(squallOptimizerGetInfo(o, &info));
  EXPECT_EQ(info.step, 20);
  EXPECT_EQ(info.warmupSteps, 15);
  EXPECT_EQ(info.phase, squallPhaseCompressed);
  EXPECT_EQ(info.skippedSteps, 0u);

  size_t size = 0, written = 0;
  EXPECT_OK(squallOptimizerStateSize(o, &size));
  std::vector<uint8_t> blob(size);
  EXPECT_OK(squallOptimizerSaveState(o, blob.data(), blob.size(), &written));
  EXPECT_EQ(written, size);
  squallOptimizer_t p = nullptr;
  EXPECT_OK(squallOptimizerCreate(comm_, count, &c, &p));
  EXPECT_OK(squallOptimizerLoadState(p, blob.data(), blob.size()));
  blob[blob.size() / 2] ^= 1;
  EXPECT_EQ(squallOptimizerLoadState(p, blob.data(), blob.size()), squallCorruptData);
  EXPECT_NE(std::string(squallGetLastError()).find("checksum"), std::string::npos);
  std::vector<float> y = x;
  const std::vector<float> g = gradient(0, 99, count);
  EXPECT_OK(squallOptimizerStep(o, x.data(), g.data(), 0.0f));
  EXPECT_OK(squallOptimizerStep(p, y.data(), g.data(), 0.0f));
  EXPECT_TRUE(sameBits(x, y));
  EXPECT_OK(squallOptimizerDestroy(o));
  EXPECT_OK(squallOptimizerDestroy(p));
  EXPECT_EQ(squallOptimizerGetInfo(nullptr, &info), squallInvalidArgument);
}

// Two ranks through the public API over TCP, each with its own communicator.
TEST(OptimApiTcp, TwoRanksStayBitIdentical) {
  squallUniqueId id;
  ASSERT_EQ(squallGetUniqueId(&id), squallSuccess) << squallGetLastError();
  const size_t count = 4000;
  std::vector<std::vector<float>> params(2, initialParams(count));
  std::vector<squallOptimInfo_t> infos(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      squallComm_t comm = nullptr;
      squallConfig_t cc = SQUALL_CONFIG_INIT;
      cc.timeoutSeconds = 20;
      squallOptimConfig_t c = SQUALL_OPTIM_CONFIG_INIT;
      c.warmupSteps = 3;
      c.slowmoTau = 4;
      squallOptimizer_t o = nullptr;
      if (squallCommInitRank(&comm, 2, id, r, &cc) != squallSuccess ||
          squallOptimizerCreate(comm, count, &c, &o) != squallSuccess) {
        errors[r] = squallGetLastError();
        return;
      }
      for (int s = 0; s < 10 && errors[r].empty(); ++s) {
        const std::vector<float> g = gradient(r, s, count);
        if (squallOptimizerStep(o, params[r].data(), g.data(), 0.0f) != squallSuccess)
          errors[r] = squallGetLastError();
      }
      squallOptimizerGetInfo(o, &infos[r]);
      squallOptimizerDestroy(o);
      squallBarrier(comm);
      squallCommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_TRUE(sameBits(params[0], params[1]));
  EXPECT_EQ(infos[0].phase, squallPhaseCompressed);
  EXPECT_GT(infos[0].bytesSent, 0u);
}

}  // namespace
}  // namespace squall
