// The codec calibration: the decision rule on synthetic paired timings (a
// clear win switches, noise and a lucky minority of rounds do not), a real
// calibration on a small segment, the per-CPU cache (round trip, a key from
// another CPU or a missing file is ignored), and the premise that makes a
// per-rank choice safe: every implementation writes the same bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "src/codec/calibrate.h"
#include "src/codec/codec.h"

namespace squall::codec {
namespace {

using Rounds = std::vector<std::array<double, kNumIsas>>;
std::vector<Isa> simd() { return {Isa::kAvx2, Isa::kAvx512}; }

// Rounds of {scalar, avx2, avx512} seconds; scalar not run (-1).
Rounds rounds(std::initializer_list<std::pair<double, double>> avx2Avx512) {
  Rounds r;
  for (const auto& [a, b] : avx2Avx512) r.push_back({-1, a, b});
  return r;
}

TEST(CodecCalibrate, ClearWinOfTheNarrowerSwitches) {
  std::string why;
  // AVX2 10% faster in every round.
  const Rounds r = rounds({{90, 100}, {91, 101}, {89, 99}, {95, 104}, {90, 100}});
  EXPECT_EQ(decideIsa(simd(), r, &why), Isa::kAvx2) << why;
  EXPECT_NE(why.find("5 of 5"), std::string::npos) << why;
}

TEST(CodecCalibrate, WidestWinsKeepTheWidest) {
  std::string why;
  const Rounds r = rounds({{100, 90}, {101, 91}, {99, 92}});
  EXPECT_EQ(decideIsa(simd(), r, &why), Isa::kAvx512) << why;
}

TEST(CodecCalibrate, NoiseKeepsTheWidest) {
  std::string why;
  // AVX2 1% faster in the median: below the margin.
  const Rounds r = rounds({{99, 100}, {100, 101}, {101, 100}, {98, 99}, {99, 100}});
  EXPECT_EQ(decideIsa(simd(), r, &why), Isa::kAvx512) << why;
  EXPECT_NE(why.find("noise"), std::string::npos) << why;
}

TEST(CodecCalibrate, ABurstOfLoadDoesNotDecide) {
  std::string why;
  // Three rounds where a burst of load hit AVX-512 hard, four where AVX-512
  // is 5% faster: AVX2's median time is lower, but it won only 3 of 7 pairs.
  const Rounds r =
      rounds({{100, 300}, {100, 280}, {100, 310}, {100, 95}, {101, 96}, {99, 94}, {100, 95}});
  EXPECT_EQ(decideIsa(simd(), r, &why), Isa::kAvx512) << why;
}

TEST(CodecCalibrate, ScalarIsACandidate) {
  std::string why;
  const Rounds r = {{50, 100, 100}, {51, 101, 100}, {49, 99, 101}};
  EXPECT_EQ(decideIsa({Isa::kScalar, Isa::kAvx2, Isa::kAvx512}, r, &why), Isa::kScalar) << why;
  EXPECT_EQ(decideIsa({Isa::kScalar}, {{1, -1, -1}}, &why), Isa::kScalar);
}

TEST(CodecCalibrate, RealCalibrationPicksAnAvailableImplementationQuickly) {
  const Calibration c = calibrateIsa(1 << 16, 3);
  EXPECT_TRUE(isaAvailable(c.chosen));
  if (c.candidates.size() < 2) GTEST_SKIP() << "only one implementation runs on this CPU";
  ASSERT_EQ(c.seconds.size(), 3u);
  for (const auto& round : c.seconds)
    for (Isa isa : c.candidates)
      if (isa != Isa::kScalar) {
        EXPECT_GT(round[static_cast<int>(isa)], 0.0);
      }
  EXPECT_LT(c.costSeconds, 5.0);
  EXPECT_FALSE(c.reason.empty());
  std::printf("calibration: %s -> %s in %.1f ms\n", c.reason.c_str(), isaName(c.chosen),
              c.costSeconds * 1e3);
}

TEST(CodecCalibrate, CacheRoundTrip) {
  char dir[] = "/tmp/squall_calibrate_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string key = calibrationCacheKey(1 << 18);
  EXPECT_NE(key.find("segment 262144"), std::string::npos) << key;
  const std::string path = calibrationCachePath(std::string(dir) + "/sub", key);
  Isa isa = Isa::kAvx2;
  EXPECT_FALSE(readCalibrationCache(path, key, &isa));  // no file yet
  Calibration c;
  c.chosen = Isa::kScalar;
  c.reason = "test";
  ASSERT_TRUE(writeCalibrationCache(path, key, c));  // creates the directory too
  std::string reason;
  ASSERT_TRUE(readCalibrationCache(path, key, &isa, &reason));
  EXPECT_EQ(isa, Isa::kScalar);
  EXPECT_EQ(reason, "test");
  // The same file read for another CPU (another key) is not used.
  isa = Isa::kAvx2;
  EXPECT_FALSE(readCalibrationCache(path, key + " other", &isa));
  EXPECT_EQ(isa, Isa::kAvx2);
  // A damaged file is not used either.
  { std::ofstream(path, std::ios::trunc) << "key " << key << "\nchoice avx9000\n"; }
  EXPECT_FALSE(readCalibrationCache(path, key, &isa));
  EXPECT_EQ(calibrationCachePath("", key), "");
  std::remove(path.c_str());
  rmdir((std::string(dir) + "/sub").c_str());
  rmdir(dir);
}

// What lets every rank choose on its own: whatever each picks, the bytes on
// the wire are the same (codec_simd_test checks this exhaustively against
// the scalar reference; this is the calibration's own segment).
std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b;
  b.reserve(v.size());
  for (float f : v) b.push_back(std::bit_cast<uint32_t>(f));
  return b;
}

TEST(CodecCalibrate, EveryImplementationWritesTheSameBytes) {
  const size_t count = (1 << 16) + 100;
  const Spec spec{CodecId::kOnebit, Scale::kMeanAbs, kDefaultBlock};
  Layout layout;
  ASSERT_EQ(layoutFor(spec, count, &layout), Status::kOk);
  std::vector<float> x(count), e(count);
  for (size_t i = 0; i < count; ++i) {
    x[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) * 1e-3f;
    e[i] = static_cast<float>(static_cast<int>(i * 40503u % 201) - 100) * 1e-5f;
  }
  std::vector<uint8_t> reference;
  std::vector<float> referenceResidual;
  int compared = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaAvailable(isa)) continue;
    std::vector<uint8_t> payload(layout.payloadBytes, 0);
    std::vector<float> residual(count, 0.0f);
    const EncodeJob job{x.data(), DType::kF32, count,           spec,
                        layout,   e.data(),    residual.data(), payload.data()};
    EXPECT_TRUE(kernelsFor(isa).codecs[static_cast<int>(CodecId::kOnebit)].encode(job));
    if (reference.empty()) {
      reference = payload;
      referenceResidual = residual;
    } else {
      EXPECT_EQ(payload, reference) << isaName(isa);
      EXPECT_EQ(bits(residual), bits(referenceResidual)) << isaName(isa);
      ++compared;
    }
  }
  if (compared == 0) GTEST_SKIP() << "only the scalar implementation runs on this CPU";
}

TEST(CodecCalibrate, ForcedImplementationIsNotCalibrated) {
  // The process-wide choice: with SQUALL_CODEC_ISA set (meson test sets it
  // for this test in a second run) the source is "forced".
  const Calibration& c = processCalibration();
  const char* forced = std::getenv("SQUALL_CODEC_ISA");
  if (forced != nullptr && std::string(forced) != "auto") {
    EXPECT_EQ(c.source, "forced");
    EXPECT_TRUE(c.seconds.empty());
    EXPECT_EQ(std::string(implementationName()), std::string(isaName(c.chosen)));
    if (std::string(forced) == "scalar") {
      EXPECT_EQ(c.chosen, Isa::kScalar);
    }
  } else {
    EXPECT_NE(c.source, "forced");
    EXPECT_TRUE(isaAvailable(c.chosen));
  }
}

}  // namespace
}  // namespace squall::codec
