// Semantics of the codecs through the public C API: closed-form values, the
// error-feedback invariant, zero blocks, the non-finite rule, validation of
// encoded buffers, and one clear error per kind of bad argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "squall/squall.h"

namespace {

using Bytes = std::vector<uint8_t>;

squallCodecSpec_t spec(squallCodec_t codec, uint32_t block = 2048,
                       squallScale_t scale = squallScaleMeanAbs) {
  return squallCodecSpec_t{codec, scale, block};
}

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Encodes `x` (fp32) and returns the bytes; fails the test on error.
Bytes encode(const squallCodecSpec_t& s, const std::vector<float>& x,
             squallResidual_t residual = nullptr) {
  size_t bytes = 0;
  EXPECT_EQ(squallEncodedSize(&s, x.size(), &bytes), squallSuccess) << squallGetLastError();
  Bytes out(bytes);
  size_t written = 0;
  EXPECT_EQ(squallEncode(&s, x.data(), squallFloat32, x.size(), residual, out.data(), out.size(),
                         &written),
            squallSuccess)
      << squallGetLastError();
  EXPECT_EQ(written, bytes);
  return out;
}

std::vector<float> decode(const Bytes& in, size_t count) {
  std::vector<float> out(count, -1.0f);
  EXPECT_EQ(squallDecode(in.data(), in.size(), out.data(), count), squallSuccess)
      << squallGetLastError();
  return out;
}

std::vector<float> randomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<float> residualValues(squallResidual_t r) {
  size_t n = 0;
  EXPECT_EQ(squallResidualGetCount(r, &n), squallSuccess);
  std::vector<float> v(n);
  EXPECT_EQ(squallResidualRead(r, v.data(), n), squallSuccess);
  return v;
}

struct ResidualHandle {
  explicit ResidualHandle(size_t n) { EXPECT_EQ(squallResidualCreate(n, &r), squallSuccess); }
  ~ResidualHandle() { squallResidualDestroy(r); }
  squallResidual_t r = nullptr;
};

// ---- closed-form values -------------------------------------------------

TEST(Onebit, SignTimesMeanAbsPerBlock) {
  std::vector<float> x(128);
  for (size_t i = 0; i < 64; ++i) x[i] = (i % 2 == 0) ? 1.0f : -3.0f;    // mean |x| = 2
  for (size_t i = 64; i < 128; ++i) x[i] = (i % 4 == 0) ? -8.0f : 0.0f;  // mean |x| = 2
  const std::vector<float> d = decode(encode(spec(squallCodecOnebit, 64), x), x.size());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(d[i], i % 2 == 0 ? 2.0f : -2.0f) << i;
  // Zero counts as non-negative: it decodes to +scale.
  for (size_t i = 64; i < 128; ++i) EXPECT_EQ(d[i], i % 4 == 0 ? -2.0f : 2.0f) << i;
}

TEST(Onebit, RmsScale) {
  std::vector<float> x(64, 0.0f);
  x[0] = 8.0f;  // rms = sqrt(64 / 64) = 1
  const std::vector<float> d =
      decode(encode(spec(squallCodecOnebit, 64, squallScaleRms), x), x.size());
  for (float v : d) EXPECT_EQ(v, 1.0f);
}

TEST(Onebit, PartialLastBlockUsesItsOwnLength) {
  std::vector<float> x(64 + 3, 1.0f);
  x[64] = 3.0f;
  x[65] = -3.0f;
  x[66] = 0.0f;  // last block: mean |x| = 2
  const std::vector<float> d = decode(encode(spec(squallCodecOnebit, 64), x), x.size());
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[64], 2.0f);
  EXPECT_EQ(d[65], -2.0f);
  EXPECT_EQ(d[66], 2.0f);
}

TEST(Onebit, WireLayoutIsLittleEndianBitsAfterScales) {
  std::vector<float> x(64, -1.0f);
  x[0] = 1.0f;
  x[63] = 1.0f;
  const Bytes b = encode(spec(squallCodecOnebit, 64), x);
  ASSERT_EQ(b.size(), 24u + 8u + 8u);  // header, one scale padded to 8, one word
  EXPECT_EQ(std::memcmp(b.data(), "SQWL", 4), 0);
  float scale;
  std::memcpy(&scale, b.data() + 24, 4);
  EXPECT_EQ(scale, 1.0f);
  uint64_t word;
  std::memcpy(&word, b.data() + 32, 8);
  EXPECT_EQ(word, (uint64_t{1} << 63) | 1u);
}

TEST(Onebit, EncodedSizeMatchesFormula) {
  const squallCodecSpec_t s = spec(squallCodecOnebit, 2048);
  for (size_t n : {size_t{0}, size_t{1}, size_t{2048}, size_t{4096}, size_t{1} << 20}) {
    size_t bytes = 0;
    ASSERT_EQ(squallEncodedSize(&s, n, &bytes), squallSuccess);
    const size_t blocks = (n + 2047) / 2048;
    EXPECT_EQ(bytes, 24 + (blocks * 4 + 7) / 8 * 8 + (n + 63) / 64 * 8) << n;
  }
}

TEST(SmallFloats, RoundToNearestEven) {
  // 1 + 2^-11 lies halfway between two halves: ties go to the even one (1.0).
  // 1 + 3 * 2^-11 is halfway too and goes up to 1 + 2^-9.
  const std::vector<float> x = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65520.0f, 1e-8f, -0.0f};
  const std::vector<float> h = decode(encode(spec(squallCodecFp16), x), x.size());
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], 1.0f + 0x1p-9f);
  EXPECT_TRUE(std::isinf(h[2]));  // halfway above the largest half rounds to infinity
  EXPECT_EQ(h[3], 0x1p-24f * std::nearbyint(1e-8f / 0x1p-24f));
  EXPECT_EQ(bitsOf(h[4]), 0x80000000u);
  const std::vector<float> y = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f,
                                std::numeric_limits<float>::max()};
  const std::vector<float> b = decode(encode(spec(squallCodecBf16), y), y.size());
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + 0x1p-6f);
  EXPECT_TRUE(std::isinf(b[2]));
}

TEST(Int8, BlockScaledRoundTrip) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 32.0f;
  x[5] = 127.0f;  // max |x| = 127 -> scale 1, every integer exact
  const std::vector<float> d = decode(encode(spec(squallCodecInt8, 64), x), x.size());
  EXPECT_EQ(d, x);
}

// The packed integer codecs, byte for byte: one block of 64 whose largest
// magnitude is L, so the scale is 1 and each code is the rounded value.
TEST(Int4, PacksTwoCodesPerByteLowNibbleFirst) {
  std::vector<float> x(64, 0.0f);
  const float values[8] = {7.0f, -7.0f, 2.5f, 3.5f, -0.5f, 1.49f, 6.6f, -6.6f};
  for (int i = 0; i < 8; ++i) x[i] = values[i];
  x[40] = -7.0f;
  const Bytes b = encode(spec(squallCodecInt4, 64), x);
  ASSERT_EQ(b.size(), 24u + 8u + 32u);  // header, one scale padded to 8, 64 nibbles
  float scale;
  std::memcpy(&scale, b.data() + 24, 4);
  EXPECT_EQ(scale, 1.0f);
  const uint8_t* q = b.data() + 32;
  // Element 2k in the low nibble of byte k, two's complement: -7 = 0x9; ties
  // round to even (2.5 -> 2, 3.5 -> 4, -0.5 -> 0); 6.6 -> 7, -6.6 -> -7.
  EXPECT_EQ(q[0], 0x97);
  EXPECT_EQ(q[1], 0x42);
  EXPECT_EQ(q[2], 0x10);
  EXPECT_EQ(q[3], 0x97);
  EXPECT_EQ(q[20], 0x09);  // element 40 in the low nibble of byte 20
  const std::vector<float> d = decode(b, x.size());
  EXPECT_EQ(d[0], 7.0f);
  EXPECT_EQ(d[1], -7.0f);
  EXPECT_EQ(d[2], 2.0f);
  EXPECT_EQ(d[3], 4.0f);
  EXPECT_EQ(bitsOf(d[4]), 0u);  // a zero code decodes to +0.0
  EXPECT_EQ(d[5], 1.0f);
}

TEST(Int2, IsTernaryWithTheBlockMaximumAsScale) {
  std::vector<float> x(64, 0.25f);
  x[0] = -4.0f;  // max |x| = 4: codes are -1, 0, +1 times 4
  x[1] = 2.0f;   // exactly half the scale: ties to even, 0
  x[2] = 2.01f;  // above half: +1
  x[3] = -3.0f;  // -1
  x[63] = 4.0f;
  ResidualHandle res(x.size());
  const Bytes b = encode(spec(squallCodecInt2, 64), x, res.r);
  ASSERT_EQ(b.size(), 24u + 8u + 16u);
  float scale;
  std::memcpy(&scale, b.data() + 24, 4);
  EXPECT_EQ(scale, 4.0f);
  const uint8_t* q = b.data() + 32;
  // Element i in bits 2 * (i % 4) of byte i / 4, two's complement: -1 = 0b11.
  EXPECT_EQ(q[0], 0b11010011);   // elements 3..0: -1, +1, 0, -1
  EXPECT_EQ(q[15], 0b01000000);  // element 63: +1, elements 60..62: 0
  const std::vector<float> d = decode(b, x.size());
  const std::vector<float> e = residualValues(res.r);
  EXPECT_EQ(d[0], -4.0f);
  EXPECT_EQ(d[2], 4.0f);
  EXPECT_EQ(e[2], 2.01f - 4.0f);
  EXPECT_EQ(d[10], 0.0f);
  EXPECT_EQ(e[10], 0.25f);  // what was not sent waits in the residual
}

TEST(IntegerCodecs, EncodedSizesAreExact) {
  // 1000 elements in blocks of 256: 4 scales (16 bytes), then the codes.
  for (auto [codec, dataBytes] :
       {std::pair{squallCodecInt2, size_t{256}}, std::pair{squallCodecInt4, size_t{504}},
        std::pair{squallCodecInt8, size_t{1000}}}) {
    const squallCodecSpec_t s = spec(codec, 256);
    size_t bytes = 0;
    ASSERT_EQ(squallEncodedSize(&s, 1000, &bytes), squallSuccess);
    EXPECT_EQ(bytes, 24u + 16u + dataBytes) << codec;
  }
  // Odd tails: 3 elements take one byte of int2 and two of int4 (padded to 8).
  for (squallCodec_t codec : {squallCodecInt2, squallCodecInt4}) {
    const squallCodecSpec_t s = spec(codec, 64);
    size_t bytes = 0;
    ASSERT_EQ(squallEncodedSize(&s, 3, &bytes), squallSuccess);
    EXPECT_EQ(bytes, 24u + 8u + 8u);
    const std::vector<float> x = {1.0f, -1.0f, 0.1f};
    const std::vector<float> d = decode(encode(s, x), 3);
    EXPECT_NEAR(d[0], 1.0f, 1e-6f);  // int4's scale is 1/7, rounded
    EXPECT_NEAR(d[1], -1.0f, 1e-6f);
  }
}

TEST(IntegerCodecs, RunningMeanConvergesForConstantInput) {
  // Error feedback makes even the ternary code unbiased over time.
  for (squallCodec_t codec : {squallCodecInt2, squallCodecInt4}) {
    const size_t n = 4096;
    ResidualHandle res(n);
    const std::vector<float> g = randomVector(n, 5);
    std::vector<double> mean(n, 0.0);
    const int calls = 400;
    for (int t = 0; t < calls; ++t) {
      const std::vector<float> d = decode(encode(spec(codec, 2048), g, res.r), n);
      for (size_t i = 0; i < n; ++i) mean[i] += d[i] / calls;
    }
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; ++i) {
      err += (mean[i] - g[i]) * (mean[i] - g[i]);
      ref += g[i] * g[i];
    }
    EXPECT_LT(std::sqrt(err / ref), 0.02) << codec;
  }
}

TEST(None, IsLossless) {
  const std::vector<float> x = randomVector(1001, 7);
  EXPECT_EQ(decode(encode(spec(squallCodecNone), x), x.size()), x);
}

TEST(Codecs, AcceptHalfAndBfloatInput) {
  // 1.5 and -0.25 are exact in both formats.
  const uint16_t half[2] = {0x3e00, 0xb400};
  const uint16_t bf[2] = {0x3fc0, 0xbe80};
  const squallCodecSpec_t s = spec(squallCodecNone);
  size_t bytes = 0;
  ASSERT_EQ(squallEncodedSize(&s, 2, &bytes), squallSuccess);
  for (auto [dtype, input] : {std::pair{squallFloat16, half}, std::pair{squallBfloat16, bf}}) {
    Bytes out(bytes);
    size_t written = 0;
    ASSERT_EQ(squallEncode(&s, input, dtype, 2, nullptr, out.data(), out.size(), &written),
              squallSuccess);
    EXPECT_EQ(decode(out, 2), (std::vector<float>{1.5f, -0.25f}));
  }
}

TEST(Codecs, DecodeAccumulateAdds) {
  const std::vector<float> x = randomVector(3000, 3);
  for (squallCodec_t c : {squallCodecNone, squallCodecOnebit, squallCodecFp16, squallCodecBf16,
                          squallCodecInt8, squallCodecInt2, squallCodecInt4}) {
    const Bytes b = encode(spec(c, 256), x);
    const std::vector<float> d = decode(b, x.size());
    std::vector<float> acc(x.size(), 0.5f);
    ASSERT_EQ(squallDecodeAccumulate(b.data(), b.size(), acc.data(), acc.size()), squallSuccess);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], 0.5f + d[i]) << i;
  }
}

// ---- error feedback -----------------------------------------------------

std::string codecTestName(const ::testing::TestParamInfo<squallCodec_t>& info) {
  static const char* const kNames[] = {"none", "onebit", "fp16", "bf16", "int8", "int2", "int4"};
  return kNames[info.param];
}

class ErrorFeedback : public ::testing::TestWithParam<squallCodec_t> {};

// Over T calls, sum(decoded) + final residual == sum(inputs), up to fp32
// rounding: the residual carries exactly what was not transmitted.
TEST_P(ErrorFeedback, TransmitsEverythingEventually) {
  const size_t n = 5000;
  const int calls = 50;
  ResidualHandle res(n);
  std::vector<double> sentSum(n, 0.0), inputSum(n, 0.0);
  for (int t = 0; t < calls; ++t) {
    const std::vector<float> x = randomVector(n, 100 + t);
    const std::vector<float> d = decode(encode(spec(GetParam(), 256), x, res.r), n);
    for (size_t i = 0; i < n; ++i) {
      inputSum[i] += x[i];
      sentSum[i] += d[i];
    }
  }
  const std::vector<float> e = residualValues(res.r);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(sentSum[i] + e[i] - inputSum[i]));
  EXPECT_LT(worst, 1e-4) << "the residual lost part of the input";
}

TEST_P(ErrorFeedback, ResidualIsInputMinusDecoded) {
  const size_t n = 700;
  ResidualHandle res(n);
  const std::vector<float> x = randomVector(n, 11);
  const std::vector<float> d = decode(encode(spec(GetParam(), 64), x, res.r), n);
  const std::vector<float> e = residualValues(res.r);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(e[i], x[i] - d[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, ErrorFeedback,
                         ::testing::Values(squallCodecNone, squallCodecOnebit, squallCodecFp16,
                                           squallCodecBf16, squallCodecInt8, squallCodecInt2,
                                           squallCodecInt4),
                         codecTestName);

TEST(Onebit, RunningMeanConvergesForConstantInput) {
  const size_t n = 4096;
  ResidualHandle res(n);
  const std::vector<float> g = randomVector(n, 5);
  std::vector<double> mean(n, 0.0);
  const int calls = 400;
  for (int t = 0; t < calls; ++t) {
    const std::vector<float> d = decode(encode(spec(squallCodecOnebit, 2048), g, res.r), n);
    for (size_t i = 0; i < n; ++i) mean[i] += d[i] / calls;
  }
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    err += (mean[i] - g[i]) * (mean[i] - g[i]);
    ref += g[i] * g[i];
  }
  EXPECT_LT(std::sqrt(err / ref), 0.05);
}

// ---- zero blocks and the non-finite rule --------------------------------

TEST(Onebit, ZeroBlocksDecodeToExactZerosAndKeepResidualZero) {
  const size_t n = 256;
  std::vector<float> x = randomVector(n, 2);
  for (size_t i = 64; i < 128; ++i) x[i] = 0.0f;
  ResidualHandle res(n);
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> d = decode(encode(spec(squallCodecOnebit, 64), x, res.r), n);
    const std::vector<float> e = residualValues(res.r);
    for (size_t i = 64; i < 128; ++i) {
      ASSERT_EQ(bitsOf(d[i]), 0u) << i;  // +0.0, not -0.0
      ASSERT_EQ(bitsOf(e[i]), 0u) << i;
    }
  }
}

class NonFinite : public ::testing::TestWithParam<std::tuple<squallCodec_t, float>> {};

TEST_P(NonFinite, BadBlockDecodesToNanAndResidualIsUntouched) {
  const auto [codec, bad] = GetParam();
  const size_t n = 256;
  ResidualHandle res(n);
  encode(spec(codec, 64), randomVector(n, 9), res.r);  // a non-trivial residual
  const std::vector<float> before = residualValues(res.r);
  std::vector<float> x = randomVector(n, 10);
  x[70] = bad;
  const std::vector<float> d = decode(encode(spec(codec, 64), x, res.r), n);
  const std::vector<float> after = residualValues(res.r);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bitsOf(after[i]), bitsOf(before[i])) << i;
  uint64_t skipped = 0;
  ASSERT_EQ(squallResidualGetSkipped(res.r, &skipped), squallSuccess);
  EXPECT_EQ(skipped, 1u);
  if (codec == squallCodecOnebit || codec == squallCodecInt8 || codec == squallCodecInt2 ||
      codec == squallCodecInt4) {
    for (size_t i = 64; i < 128; ++i) ASSERT_TRUE(std::isnan(d[i])) << i;
    for (size_t i = 0; i < 64; ++i) ASSERT_TRUE(std::isfinite(d[i])) << i;
    for (size_t i = 128; i < n; ++i) ASSERT_TRUE(std::isfinite(d[i])) << i;
  } else {
    EXPECT_FALSE(std::isfinite(d[70]));
  }
  // The next finite call proceeds from the preserved residual.
  encode(spec(codec, 64), randomVector(n, 12), res.r);
  ASSERT_EQ(squallResidualGetSkipped(res.r, &skipped), squallSuccess);
  EXPECT_EQ(skipped, 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, NonFinite,
    ::testing::Combine(::testing::Values(squallCodecNone, squallCodecOnebit, squallCodecFp16,
                                         squallCodecBf16, squallCodecInt8, squallCodecInt2,
                                         squallCodecInt4),
                       ::testing::Values(std::numeric_limits<float>::quiet_NaN(),
                                         std::numeric_limits<float>::infinity(),
                                         -std::numeric_limits<float>::infinity())));

TEST(Onebit, NonFiniteScaleIsStoredAsOneCanonicalNan) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::quiet_NaN(), 3e38f}) {
    std::vector<float> x(128, 1.0f);
    x[64] = bad;
    x[65] = bad;  // 3e38 twice overflows the block sum
    const Bytes b = encode(spec(squallCodecOnebit, 64), x);
    uint32_t scale1;
    std::memcpy(&scale1, b.data() + 24 + 4, 4);
    EXPECT_EQ(scale1, 0x7fc00000u) << bad;
  }
}

TEST(Fp16, SignallingNanInputIsQuietened) {
  const uint16_t snan = 0x7c01;
  const squallCodecSpec_t s = spec(squallCodecNone);
  Bytes out(32);
  size_t written = 0;
  ASSERT_EQ(squallEncode(&s, &snan, squallFloat16, 1, nullptr, out.data(), out.size(), &written),
            squallSuccess);
  EXPECT_EQ(bitsOf(decode(out, 1)[0]), 0x7fc02000u);  // as the F16C instructions convert it
}

TEST(Fp16, OverflowToInfinityCountsAsNonFinite) {
  const size_t n = 8;
  ResidualHandle res(n);
  std::vector<float> x(n, 1.0f);
  x[3] = 1e6f;  // beyond the half range
  encode(spec(squallCodecFp16), x, res.r);
  uint64_t skipped = 0;
  ASSERT_EQ(squallResidualGetSkipped(res.r, &skipped), squallSuccess);
  EXPECT_EQ(skipped, 1u);
  for (float e : residualValues(res.r)) EXPECT_EQ(e, 0.0f);
}

// ---- validation of encoded buffers --------------------------------------

TEST(Decode, RejectsTruncatedAndPaddedBuffers) {
  const Bytes b = encode(spec(squallCodecOnebit, 64), randomVector(1000, 1));
  std::vector<float> out(1000);
  for (size_t len : {size_t{0}, size_t{10}, size_t{23}, size_t{24}, b.size() - 8, b.size() - 1}) {
    Bytes cut(b.begin(), b.begin() + static_cast<long>(len));
    EXPECT_EQ(squallDecode(cut.data(), cut.size(), out.data(), out.size()), squallCorruptData)
        << len;
    EXPECT_NE(std::string(squallGetLastError()).find("truncated"), std::string::npos)
        << squallGetLastError();
  }
  Bytes longer = b;
  longer.resize(b.size() + 8);
  EXPECT_EQ(squallDecode(longer.data(), longer.size(), out.data(), out.size()), squallCorruptData);
}

TEST(Decode, RejectsCorruptHeaders) {
  const Bytes good = encode(spec(squallCodecOnebit, 64), randomVector(100, 1));
  std::vector<float> out(100);
  struct Corruption {
    size_t offset;
    uint8_t value;
    const char* expect;
  };
  const Corruption cases[] = {
      {0, 'X', "magic"},  {4, 2, "version"},      {5, 9, "corrupt"},
      {6, 5, "corrupt"},  {7, 1, "corrupt"},      {8, 65, "block"},
      {12, 1, "corrupt"}, {16, 200, "truncated"}, {23, 0x80, "truncated"},
  };
  for (const Corruption& c : cases) {
    Bytes b = good;
    b[c.offset] = c.value;
    EXPECT_EQ(squallDecode(b.data(), b.size(), out.data(), out.size()), squallCorruptData)
        << c.offset;
    EXPECT_NE(std::string(squallGetLastError()).find(c.expect), std::string::npos)
        << c.offset << ": " << squallGetLastError();
  }
}

TEST(Decode, RandomHeaderDamageNeverSucceedsSilentlyOrOverflows) {
  const Bytes good = encode(spec(squallCodecInt8, 64), randomVector(300, 1));
  std::vector<float> out(300);
  std::mt19937 rng(42);
  for (int trial = 0; trial < 5000; ++trial) {
    Bytes b = good;
    const size_t at = rng() % 24;
    b[at] ^= static_cast<uint8_t>(1u + rng() % 255);
    squallResult_t r = squallDecode(b.data(), b.size(), out.data(), out.size());
    EXPECT_TRUE(r == squallCorruptData || r == squallInvalidUsage) << at;
  }
}

TEST(Decode, CountMustMatch) {
  const Bytes b = encode(spec(squallCodecOnebit, 64), randomVector(100, 1));
  std::vector<float> out(101);
  EXPECT_EQ(squallDecode(b.data(), b.size(), out.data(), 101), squallInvalidUsage);
  EXPECT_NE(std::string(squallGetLastError()).find("holds 100 elements"), std::string::npos);
}

TEST(Inspect, ReportsSpecAndCount) {
  const Bytes b = encode(spec(squallCodecOnebit, 512, squallScaleRms), randomVector(77, 1));
  squallCodecSpec_t s{};
  size_t n = 0;
  ASSERT_EQ(squallEncodedInspect(b.data(), b.size(), &s, &n), squallSuccess);
  EXPECT_EQ(s.codec, squallCodecOnebit);
  EXPECT_EQ(s.scale, squallScaleRms);
  EXPECT_EQ(s.blockSize, 512u);
  EXPECT_EQ(n, 77u);
}

// ---- bad arguments: each its own clear error ----------------------------

struct BadCall {
  const char* name;
  squallResult_t expected;
  const char* message;  // a phrase the error must contain
};

void expectError(squallResult_t got, const BadCall& c) {
  EXPECT_EQ(got, c.expected) << c.name;
  EXPECT_NE(std::string(squallGetLastError()).find(c.message), std::string::npos)
      << c.name << ": \"" << squallGetLastError() << "\"";
}

TEST(BadArguments, EachGetsItsOwnError) {
  const std::vector<float> x(100, 1.0f);
  squallCodecSpec_t good = spec(squallCodecOnebit, 64);
  Bytes out(4096);
  size_t written = 0;
  auto enc = [&](const squallCodecSpec_t* s, const void* in, squallDataType_t t, size_t n,
                 squallResidual_t r, void* o, size_t cap,
                 size_t* w) { return squallEncode(s, in, t, n, r, o, cap, w); };
  expectError(enc(nullptr, x.data(), squallFloat32, 100, nullptr, out.data(), out.size(), &written),
              {"null spec", squallInvalidArgument, "spec pointer is NULL"});
  expectError(enc(&good, nullptr, squallFloat32, 100, nullptr, out.data(), out.size(), &written),
              {"null input", squallInvalidArgument, "input pointer is NULL"});
  expectError(enc(&good, x.data(), squallFloat32, 100, nullptr, nullptr, out.size(), &written),
              {"null output", squallInvalidArgument, "output pointer is NULL"});
  expectError(enc(&good, x.data(), squallFloat32, 100, nullptr, out.data(), out.size(), nullptr),
              {"null written", squallInvalidArgument, "written-bytes output pointer is NULL"});
  expectError(enc(&good, x.data(), squallFloat64, 100, nullptr, out.data(), out.size(), &written),
              {"bad dtype", squallInvalidArgument, "not data type 3"});
  expectError(enc(&good, x.data(), squallFloat32, 100, nullptr, out.data(), 10, &written),
              {"small output", squallInvalidArgument, "size it with squallEncodedSize"});
  expectError(enc(&good, x.data(), squallFloat32, 100, nullptr, const_cast<float*>(x.data()) + 10,
                  4096, &written),
              {"overlap", squallInvalidUsage, "overlap"});
  for (uint32_t block : {0u, 32u, 63u, 96u, 1u << 31}) {
    squallCodecSpec_t s = spec(squallCodecOnebit, block);
    expectError(enc(&s, x.data(), squallFloat32, 100, nullptr, out.data(), out.size(), &written),
                {"bad block", squallInvalidArgument, "power of two"});
  }
  squallCodecSpec_t unknown = spec(static_cast<squallCodec_t>(7));
  expectError(
      enc(&unknown, x.data(), squallFloat32, 100, nullptr, out.data(), out.size(), &written),
      {"unknown codec", squallInvalidArgument, "unknown codec 7"});
  squallCodecSpec_t badScale = spec(squallCodecOnebit, 64, static_cast<squallScale_t>(3));
  expectError(
      enc(&badScale, x.data(), squallFloat32, 100, nullptr, out.data(), out.size(), &written),
      {"unknown scale", squallInvalidArgument, "unknown scale kind 3"});
  size_t bytes = 0;
  squallCodecSpec_t half = spec(squallCodecFp16);
  expectError(squallEncodedSize(&half, std::numeric_limits<size_t>::max() / 2, &bytes),
              {"overflow fp16", squallInvalidArgument, "more than SIZE_MAX"});
  squallCodecSpec_t none = spec(squallCodecNone);
  expectError(squallEncodedSize(&none, std::numeric_limits<size_t>::max() / 3, &bytes),
              {"overflow fp32", squallInvalidArgument, "more than SIZE_MAX"});
  ResidualHandle res(50);
  expectError(enc(&good, x.data(), squallFloat32, 100, res.r, out.data(), out.size(), &written),
              {"residual size", squallInvalidUsage, "created for 50 elements"});
  squallResidual_t r = nullptr;
  expectError(squallResidualCreate(std::numeric_limits<size_t>::max() / 2, &r),
              {"huge residual", squallInvalidArgument, "SIZE_MAX"});
  expectError(squallResidualCreate(10, nullptr),
              {"null residual out", squallInvalidArgument, "residual output pointer is NULL"});
  expectError(squallResidualReset(nullptr), {"null residual", squallInvalidArgument, "NULL"});
  std::vector<float> buf(10);
  expectError(squallResidualRead(res.r, buf.data(), 10),
              {"residual read size", squallInvalidUsage, "holds 50 elements"});
  expectError(squallDecode(out.data(), 100, nullptr, 5),
              {"null decode output", squallInvalidArgument, "output pointer is NULL"});
  // Nothing was written by any failed call.
  EXPECT_EQ(written, 0u);
  EXPECT_EQ(r, nullptr);
}

TEST(BadArguments, NothingWrittenOnFailure) {
  const std::vector<float> x(100, 1.0f);
  squallCodecSpec_t s = spec(squallCodecOnebit, 64);
  Bytes out(10, 0xAB);
  size_t written = 12345;
  EXPECT_NE(
      squallEncode(&s, x.data(), squallFloat32, 100, nullptr, out.data(), out.size(), &written),
      squallSuccess);
  EXPECT_EQ(written, 12345u);
  for (uint8_t b : out) EXPECT_EQ(b, 0xAB);
}

TEST(Api, VersionAndErrorStrings) {
  int v = 0;
  ASSERT_EQ(squallGetVersion(&v), squallSuccess);
  EXPECT_EQ(v, SQUALL_VERSION_CODE);
  EXPECT_STREQ(squallGetErrorString(squallCorruptData), "corrupt data");
  EXPECT_STREQ(squallGetErrorString(static_cast<squallResult_t>(99)), "unknown result code");
  EXPECT_STREQ(squallGetLastError(), "");  // the successful call cleared it
}

TEST(Api, SpecParse) {
  squallCodecSpec_t s{};
  ASSERT_EQ(squallCodecSpecParse("onebit:block=4096:scale=rms", &s), squallSuccess);
  EXPECT_EQ(s.codec, squallCodecOnebit);
  EXPECT_EQ(s.blockSize, 4096u);
  EXPECT_EQ(s.scale, squallScaleRms);
  ASSERT_EQ(squallCodecSpecParse("fp16", &s), squallSuccess);
  EXPECT_EQ(s.codec, squallCodecFp16);
  for (auto [text, codec] : {std::pair{"int2", squallCodecInt2}, std::pair{"int4", squallCodecInt4},
                             std::pair{"int8", squallCodecInt8}}) {
    ASSERT_EQ(squallCodecSpecParse(text, &s), squallSuccess) << text;
    EXPECT_EQ(s.codec, codec);
    EXPECT_EQ(s.blockSize, 2048u);
  }
  ASSERT_EQ(squallCodecSpecParse("int2:block=256", &s), squallSuccess);
  EXPECT_EQ(s.blockSize, 256u);
  EXPECT_EQ(squallCodecSpecParse("int4:block=100", &s), squallInvalidArgument);
  EXPECT_EQ(squallCodecSpecParse("onebit:block=100", &s), squallInvalidArgument);
  EXPECT_EQ(squallCodecSpecParse("twobit", &s), squallInvalidArgument);
  EXPECT_NE(std::string(squallGetLastError()).find("unknown codec \"twobit\""), std::string::npos);
  EXPECT_EQ(squallCodecSpecParse("onebit:fast", &s), squallInvalidArgument);
}

TEST(Api, EmptyInputEncodesToHeaderOnly) {
  squallCodecSpec_t s = spec(squallCodecOnebit);
  Bytes out(24);
  size_t written = 0;
  ASSERT_EQ(squallEncode(&s, nullptr, squallFloat32, 0, nullptr, out.data(), out.size(), &written),
            squallSuccess);
  EXPECT_EQ(written, 24u);
  EXPECT_EQ(squallDecode(out.data(), out.size(), nullptr, 0), squallSuccess);
}

}  // namespace
