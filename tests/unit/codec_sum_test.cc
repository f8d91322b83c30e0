// The fused sums of several encodings (parallel.h: parallelDecodeSum,
// parallelEncodeSum; codec.h: decodeSum, encodeSum) against the passes they
// replace, run over the whole buffer with the same kernel table: decode,
// decode-accumulate of the others in order, divideAll, then encode with error
// feedback. Bits, bytes, residuals and the finite flag must be the same for
// every implementation, codec, encoding count, divisor, tile-crossing length,
// thread count, output alignment and store kind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/kernels.h"
#include "src/codec/numeric.h"
#include "src/codec/parallel.h"

namespace squall::codec {
namespace {

struct Case {
  Isa isa;
  Spec spec;
  size_t n;      // encodings summed
  size_t count;  // elements
};

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

std::string caseName(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = std::string(isaName(c.isa)) + "_" + codecName(c.spec.codec);
  if (c.spec.codec == CodecId::kOnebit) name += c.spec.scale == Scale::kRms ? "_rms" : "_meanabs";
  if (usesBlocks(c.spec.codec)) name += "_b" + std::to_string(c.spec.block);
  return name + "_n" + std::to_string(c.n) + "_c" + std::to_string(c.count);
}

bool sameBits(const float* a, const float* b, size_t count, size_t* at) {
  for (size_t i = 0; i < count; ++i) {
    if (floatBits(a[i]) != floatBits(b[i])) {
      *at = i;
      return false;
    }
  }
  return true;
}

// 64-byte aligned floats, `offset` floats past the boundary.
class Floats {
 public:
  Floats(size_t count, size_t offset) : storage_(count + offset + 16, -7.0f) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - base % 64) % 64) / 4 + offset;
  }
  float* data() { return data_; }

 private:
  std::vector<float> storage_;
  float* data_;
};

class CodecSum : public testing::TestWithParam<Case> {};

TEST_P(CodecSum, MatchesTheSeparatePasses) {
  const Case& c = GetParam();
  if (!isaAvailable(c.isa)) GTEST_SKIP() << isaName(c.isa) << " is not available on this CPU";
  const CodecKernels& k = kernelsFor(c.isa).codecs[static_cast<int>(c.spec.codec)];
  Layout layout;
  ASSERT_EQ(layoutFor(c.spec, c.count, &layout), Status::kOk);

  // n encodings of random inputs; one element of encoding 1 is infinite
  // when there are several, so that the non-finite path is summed too.
  std::mt19937 rng(static_cast<uint32_t>(c.count * 31 + c.n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint8_t>> payloads(c.n, std::vector<uint8_t>(layout.payloadBytes));
  std::vector<const uint8_t*> pointers;
  for (size_t j = 0; j < c.n; ++j) {
    std::vector<float> x(c.count);
    for (float& v : x) v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
    if (j == 1) x[c.count / 2] = INFINITY;
    k.encode(EncodeJob{x.data(), DType::kF32, c.count, c.spec, layout, nullptr, nullptr,
                       payloads[j].data()});
    pointers.push_back(payloads[j].data());
  }
  std::vector<float> residual(c.count);
  for (float& e : residual) e = normal(rng) * 0.1f;

  for (const int divisor : {1, static_cast<int>(c.n), 3}) {
    // The separate passes over the whole buffer.
    std::vector<float> want(c.count);
    for (size_t j = 0; j < c.n; ++j) {
      const DecodeJob job{payloads[j].data(), c.count, c.spec, layout, want.data()};
      (j == 0 ? k.decode : k.accumulate)(job);
    }
    if (divisor > 1) divideAll(want.data(), c.count, divisor);
    std::vector<uint8_t> wantPayload(layout.payloadBytes);
    std::vector<float> wantResidual(c.count);
    const bool wantFinite =
        k.encode(EncodeJob{want.data(), DType::kF32, c.count, c.spec, layout, residual.data(),
                           wantResidual.data(), wantPayload.data()});

    const SumJob sum{pointers.data(), c.n, c.count, c.spec, layout, divisor};
    for (const int threads : {1, 3}) {
      for (const bool stream : {false, true}) {
        for (const size_t offset : {size_t{0}, size_t{1}}) {
          SCOPED_TRACE(testing::Message()
                       << "divisor " << divisor << ", threads " << threads
                       << (stream ? ", streaming" : ", cached") << ", output offset " << offset);
          Floats got(c.count, offset);
          parallelDecodeSum(k, sum, got.data(), stream, threads);
          size_t at = 0;
          ASSERT_TRUE(sameBits(want.data(), got.data(), c.count, &at))
              << "decoded sum differs at element " << at << ": " << want[at] << " vs "
              << got.data()[at];
          ASSERT_EQ(got.data()[c.count], -7.0f) << "the sum wrote past its output";

          std::vector<uint8_t> gotPayload(layout.payloadBytes);
          Floats gotResidual(c.count, offset);
          EncodeJob job{nullptr,         DType::kF32,        c.count,           c.spec, layout,
                        residual.data(), gotResidual.data(), gotPayload.data(), stream};
          const bool gotFinite = parallelEncodeSum(k, sum, k.encode, job, threads);
          ASSERT_EQ(wantFinite, gotFinite);
          ASSERT_EQ(wantPayload, gotPayload) << "the encoded sum's bytes differ";
          ASSERT_TRUE(sameBits(wantResidual.data(), gotResidual.data(), c.count, &at))
              << "residual differs at element " << at;
        }
      }
    }
  }
}

std::vector<Case> allCases() {
  const Spec specs[] = {{CodecId::kOnebit, Scale::kMeanAbs, 2048},
                        {CodecId::kOnebit, Scale::kRms, 64},
                        {CodecId::kOnebit, Scale::kRms, 16384},  // a tile per block
                        {CodecId::kInt8, Scale::kMeanAbs, 256},
                        {CodecId::kInt4, Scale::kMeanAbs, 64},
                        {CodecId::kInt2, Scale::kMeanAbs, 2048},
                        {CodecId::kFp16, Scale::kMeanAbs, kDefaultBlock},
                        {CodecId::kBf16, Scale::kMeanAbs, kDefaultBlock},
                        {CodecId::kNone, Scale::kMeanAbs, kDefaultBlock}};
  std::vector<Case> cases;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    for (const Spec& spec : specs)
      for (size_t n : {1, 2, 3, 5})
        for (size_t count : {1, 63, 4097, 40003}) cases.push_back({isa, spec, n, count});
  // More encodings than a register sum takes (kMaxSumEncodings): tiles.
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    cases.push_back({isa, specs[0], kMaxSumEncodings + 1, 4097});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecSum, testing::ValuesIn(allCases()), caseName);

// ---- the public calls: headers checked, nothing written on a refusal --------

std::vector<uint8_t> encoded(const Spec& spec, const std::vector<float>& x) {
  size_t bytes = 0;
  EXPECT_EQ(encodedSize(spec, x.size(), &bytes), Status::kOk);
  std::vector<uint8_t> out(bytes);
  EncodeResult r;
  EXPECT_EQ(encodeRaw(spec, x.data(), DType::kF32, x.size(), nullptr, nullptr, out.data(),
                      out.size(), &r),
            Status::kOk);
  return out;
}

TEST(CodecSumCalls, AgreeWithDecodeAndEncode) {
  const Spec spec{CodecId::kOnebit, Scale::kRms, 64};
  const size_t count = 5000;
  std::vector<float> a(count), b(count), residual(count, 0.25f);
  for (size_t i = 0; i < count; ++i) {
    a[i] = std::sin(static_cast<float>(i));
    b[i] = std::cos(static_cast<float>(i) * 0.5f);
  }
  const std::vector<uint8_t> ea = encoded(spec, a), eb = encoded(spec, b);
  const uint8_t* both[] = {ea.data(), eb.data()};

  std::vector<float> want(count), got(count);
  ASSERT_EQ(decode(ea.data(), ea.size(), want.data(), count), Status::kOk);
  ASSERT_EQ(decodeAccumulate(eb.data(), eb.size(), want.data(), count), Status::kOk);
  divideAll(want.data(), count, 2);
  ASSERT_EQ(decodeSum(both, 2, ea.size(), got.data(), count, 2, Stores::kStream), Status::kOk);
  size_t at = 0;
  ASSERT_TRUE(sameBits(want.data(), got.data(), count, &at)) << "element " << at;

  std::vector<uint8_t> wantEnc(ea.size()), gotEnc(ea.size());
  std::vector<float> wantRes(count), gotRes(count);
  EncodeResult wr, gr;
  ASSERT_EQ(encodeRaw(spec, want.data(), DType::kF32, count, residual.data(), wantRes.data(),
                      wantEnc.data(), wantEnc.size(), &wr),
            Status::kOk);
  ASSERT_EQ(encodeSum(spec, both, 2, ea.size(), count, 2, residual.data(), gotRes.data(),
                      gotEnc.data(), gotEnc.size(), &gr),
            Status::kOk);
  EXPECT_EQ(wr.bytes, gr.bytes);
  EXPECT_EQ(wr.finite, gr.finite);
  EXPECT_EQ(wantEnc, gotEnc);
  EXPECT_TRUE(sameBits(wantRes.data(), gotRes.data(), count, &at)) << "residual element " << at;
}

TEST(CodecSumCalls, RefuseMismatchedEncodingsAndWriteNothing) {
  const Spec spec{CodecId::kOnebit, Scale::kMeanAbs, 64};
  const std::vector<float> x(640, 1.5f), shorter(576, 1.5f);
  const std::vector<uint8_t> e = encoded(spec, x);
  std::vector<uint8_t> other = encoded(spec, shorter);
  other.resize(e.size());  // same bytes claimed, fewer elements in the header
  const std::vector<uint8_t> rms = encoded({CodecId::kOnebit, Scale::kRms, 64}, x);
  std::vector<float> out(x.size(), 9.0f);
  std::vector<uint8_t> enc(e.size(), 0x5a);
  std::vector<float> res(x.size(), 0.0f), resOut(x.size(), 3.0f);
  EncodeResult r;

  const uint8_t* wrongCount[] = {e.data(), other.data()};
  EXPECT_EQ(decodeSum(wrongCount, 2, e.size(), out.data(), x.size(), 1), Status::kCorruptData)
      << "an encoding of fewer elements in the bytes of more";
  const uint8_t* wrongSpec[] = {e.data(), rms.data()};
  EXPECT_EQ(decodeSum(wrongSpec, 2, e.size(), out.data(), x.size(), 1), Status::kInvalidUsage);
  EXPECT_EQ(encodeSum(spec, wrongSpec, 2, e.size(), x.size(), 1, res.data(), resOut.data(),
                      enc.data(), enc.size(), &r),
            Status::kInvalidUsage);
  const uint8_t* fine[] = {e.data(), e.data()};
  EXPECT_EQ(encodeSum({CodecId::kOnebit, Scale::kMeanAbs, 128}, fine, 2, e.size(), x.size(), 1,
                      res.data(), resOut.data(), enc.data(), enc.size(), &r),
            Status::kInvalidUsage)
      << "re-encoding with another block";
  EXPECT_EQ(encodeSum(spec, fine, 2, e.size(), x.size(), 1, res.data(), resOut.data(), enc.data(),
                      enc.size() - 1, &r),
            Status::kInvalidArgument)
      << "an output too small";
  for (float v : out) ASSERT_EQ(v, 9.0f) << "a refused sum wrote its output";
  for (uint8_t b : enc) ASSERT_EQ(b, 0x5a) << "a refused encodeSum wrote its output";
  for (float v : resOut) ASSERT_EQ(v, 3.0f) << "a refused encodeSum wrote its residual";
}

// Under SQUALL_STREAM_STORES=auto (the tests' default) the new residuals
// stream past one core's L2 and the outputs past the last-level cache.
TEST(StoreKinds, ResidualsStreamPastTheL2AndOutputsPastTheLastLevelCache) {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l2 <= 0 || l3 <= l2) GTEST_SKIP() << "sysconf does not give an L2 below the L3";
  const size_t a = static_cast<size_t>(l2), b = static_cast<size_t>(l3);
  EXPECT_EQ(residualStoresFor(a), Stores::kCached);
  EXPECT_EQ(residualStoresFor(a + 1), Stores::kStream);
  EXPECT_EQ(storesFor(a + 1), Stores::kCached);
  EXPECT_EQ(storesFor(b), Stores::kCached);
  EXPECT_EQ(storesFor(b + 1), Stores::kStream);
}

}  // namespace
}  // namespace squall::codec
