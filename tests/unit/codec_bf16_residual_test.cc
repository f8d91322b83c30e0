// Residuals stored in bf16 (codec::ResidualStore::kBf16) against fp32 ones:
// for every codec, implementation, thread count, input dtype and block size,
// over lengths that span several tiles and end in a partial block, an
// encode with a bf16 residual writes the bytes and the finite flag of the
// fp32 kernel fed the widened residual, and stores that kernel's new
// residual rounded to bf16 (ties to even); the same for the encode of a sum
// (the two-phase allreduce's server step). Also the Residual object of
// either store (bytes, values, read and write, reset, commit) and the
// rounding itself on the values where it is hard (ties, NaN, infinities,
// subnormals, the largest finite values).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/kernels.h"
#include "src/codec/numeric.h"
#include "src/codec/parallel.h"

namespace squall::codec {
namespace {

std::vector<uint8_t> inputOf(DType dtype, size_t count, uint32_t seed, size_t nonFiniteAt) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> x(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    float v = normal(rng) * (i % 11 == 0 ? 50.0f : 1.0f);
    if (i == nonFiniteAt) v = NAN;
    if (dtype == DType::kF32) {
      std::memcpy(x.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = floatToBf16(v);
      std::memcpy(x.data() + 2 * i, &h, 2);
    }
  }
  return x;
}

// An owed residual of the sizes error feedback leaves (a fraction of the
// input's), in bf16.
std::vector<uint16_t> owedOf(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<uint16_t> owed(count);
  for (uint16_t& h : owed) h = floatToBf16(normal(rng));
  return owed;
}

struct Result {
  std::vector<uint8_t> payload;
  std::vector<uint16_t> residual;  // the new residual, as bf16
  bool finite = true;
};

// The reference: the fp32 kernel fed the widened residual, its new residual
// rounded to bf16.
Result throughFp32(EncodeFn fn, const Spec& spec, const Layout& layout, DType dtype,
                   const std::vector<uint8_t>& x, size_t count, const std::vector<uint16_t>& owed) {
  Result out;
  out.payload.assign(layout.payloadBytes, 0x5a);
  std::vector<float> in(count), left(count, -1.0f);
  for (size_t i = 0; i < count; ++i) in[i] = bf16ToFloat(owed[i]);
  out.finite = fn(
      EncodeJob{x.data(), dtype, count, spec, layout, in.data(), left.data(), out.payload.data()});
  out.residual.resize(count);
  for (size_t i = 0; i < count; ++i) out.residual[i] = floatToBf16(left[i]);
  return out;
}

Result throughBf16(EncodeFn fn, const Spec& spec, const Layout& layout, DType dtype,
                   const std::vector<uint8_t>& x, size_t count, const std::vector<uint16_t>& owed,
                   int threads) {
  Result out;
  out.payload.assign(layout.payloadBytes, 0x5a);
  out.residual.assign(count, 0xdead);
  const Bf16Residual bf16{owed.data(), out.residual.data()};
  out.finite = parallelEncode(
      fn, EncodeJob{x.data(), dtype, count, spec, layout, nullptr, nullptr, out.payload.data()},
      threads, &bf16);
  return out;
}

TEST(Bf16Residual, KernelsStoreTheRoundedFp32Residual) {
  const size_t m = minElementsPerThread();
  const size_t counts[] = {1, size_t{4096} * 3 + 77, 2 * m + size_t{2048} * 3 + 5};
  int checked = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaAvailable(isa)) continue;
    const KernelTable& table = kernelsFor(isa);
    for (int c = 0; c < kNumCodecs; ++c) {
      const auto codec = static_cast<CodecId>(c);
      for (uint32_t block : {64u, 2048u, 8192u}) {
        if (!usesBlocks(codec) && block != 2048u) continue;
        for (DType dtype : {DType::kF32, DType::kBf16}) {
          for (size_t count : counts) {
            for (bool poisoned : {false, true}) {
              const Spec spec{codec, Scale::kRms, block};
              Layout layout;
              ASSERT_EQ(layoutFor(spec, count, &layout), Status::kOk);
              const auto x = inputOf(dtype, count, static_cast<uint32_t>(count + block),
                                     poisoned ? count - 1 : count);
              const auto owed = owedOf(count, static_cast<uint32_t>(c + count));
              const EncodeFn fn = table.codecs[c].encode;
              const Result want = throughFp32(fn, spec, layout, dtype, x, count, owed);
              for (int threads : {1, 3}) {
                SCOPED_TRACE(::testing::Message()
                             << table.name << " " << codecName(codec) << " block " << block
                             << " count " << count << " poisoned " << poisoned << " threads "
                             << threads);
                const Result got = throughBf16(fn, spec, layout, dtype, x, count, owed, threads);
                ASSERT_EQ(got.payload, want.payload);
                ASSERT_EQ(got.finite, want.finite);
                ASSERT_EQ(got.finite, !poisoned);
                if (got.finite) {
                  ASSERT_EQ(got.residual, want.residual);
                }
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// The encode of a sum: bytes and residual of the fp32 store's, rounded.
TEST(Bf16Residual, SumsStoreTheRoundedFp32Residual) {
  constexpr size_t kCount = 3 * 4096 + 300;
  constexpr size_t kN = 3;
  for (const Spec& spec :
       {Spec{CodecId::kInt4, Scale::kMeanAbs, 64}, Spec{CodecId::kOnebit, Scale::kRms, 64},
        Spec{CodecId::kInt8, Scale::kMeanAbs, 2048}}) {
    SCOPED_TRACE(codecName(spec.codec));
    size_t bytes = 0;
    ASSERT_EQ(encodedSize(spec, kCount, &bytes), Status::kOk);
    std::vector<std::vector<uint8_t>> encodings(kN, std::vector<uint8_t>(bytes));
    std::vector<const uint8_t*> pointers;
    for (size_t j = 0; j < kN; ++j) {
      const auto x = inputOf(DType::kF32, kCount, static_cast<uint32_t>(j), kCount);
      EncodeResult r;
      ASSERT_EQ(encodeRaw(spec, x.data(), DType::kF32, kCount, ResidualSpan{}, encodings[j].data(),
                          bytes, &r),
                Status::kOk);
      pointers.push_back(encodings[j].data());
    }
    const auto owed = owedOf(kCount, 9);
    std::vector<float> in(kCount), left(kCount);
    for (size_t i = 0; i < kCount; ++i) in[i] = bf16ToFloat(owed[i]);
    std::vector<uint16_t> narrowOut(kCount, 0xdead);
    std::vector<uint8_t> wide(bytes), narrow(bytes);
    EncodeResult a, b;
    ASSERT_EQ(encodeSum(spec, pointers.data(), kN, bytes, kCount, 3, in.data(), left.data(),
                        wide.data(), bytes, &a),
              Status::kOk);
    ASSERT_EQ(encodeSum(spec, pointers.data(), kN, bytes, kCount, 3,
                        ResidualSpan(owed.data(), narrowOut.data(), ResidualStore::kBf16),
                        narrow.data(), bytes, &b),
              Status::kOk);
    EXPECT_EQ(narrow, wide);
    EXPECT_EQ(a.finite, b.finite);
    for (size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(narrowOut[i], floatToBf16(left[i])) << "element " << i;
  }
}

TEST(Bf16Residual, ResidualObjectOfEitherStore) {
  constexpr size_t kCount = 100000;  // mapped (above 128 KiB in fp32, 200 KB in bf16)
  std::unique_ptr<Residual> f32, bf16;
  ASSERT_EQ(Residual::create(kCount, &f32), Status::kOk);
  ASSERT_EQ(Residual::create(kCount, &bf16, ResidualStore::kBf16), Status::kOk);
  EXPECT_EQ(f32->bytes(), 2 * kCount * 4);
  EXPECT_EQ(bf16->bytes(), 2 * kCount * 2);
  EXPECT_EQ(bf16->store(), ResidualStore::kBf16);
  EXPECT_EQ(bf16->current(), nullptr);  // no fp32 view of a bf16 store
  EXPECT_NE(f32->current(), nullptr);
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = 1.0f / static_cast<float>(i + 3);
  bf16->write(values.data(), kCount);
  f32->write(values.data(), kCount);
  std::vector<float> back(kCount);
  bf16->read(back.data(), kCount);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(back[i], bf16ToFloat(floatToBf16(values[i])));
    ASSERT_EQ(bf16->value(i), back[i]);
    ASSERT_EQ(f32->value(i), values[i]);
  }
  bf16->setValue(5, 3.0f);
  EXPECT_EQ(bf16->value(5), 3.0f);
  // An encode writes the other half; commit makes it current, a skipped one does not.
  const Spec spec{CodecId::kInt4, Scale::kMeanAbs, 64};
  size_t bytes = 0;
  ASSERT_EQ(encodedSize(spec, kCount, &bytes), Status::kOk);
  std::vector<uint8_t> out(bytes);
  std::vector<float> x(kCount, 0.3f);
  EncodeResult r;
  ASSERT_EQ(encode(spec, x.data(), DType::kF32, kCount, bf16.get(), out.data(), bytes, &r),
            Status::kOk);
  EXPECT_NE(bf16->value(5), 3.0f);
  x[7] = NAN;
  const float before = bf16->value(9);
  ASSERT_EQ(encode(spec, x.data(), DType::kF32, kCount, bf16.get(), out.data(), bytes, &r),
            Status::kOk);
  EXPECT_FALSE(r.finite);
  EXPECT_EQ(bf16->value(9), before);
  EXPECT_EQ(bf16->skipped(), 1u);
  bf16->reset();
  for (size_t i = 0; i < kCount; i += 997) ASSERT_EQ(bf16->value(i), 0.0f);
  std::unique_ptr<Residual> bad;
  EXPECT_EQ(Residual::create(4, &bad, static_cast<ResidualStore>(7)), Status::kInvalidArgument);
}

TEST(Bf16Residual, RoundingMatchesTheScalarConversion) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          bitsFloat(0x3f808000u),  // a tie, even below: rounds down
                          bitsFloat(0x3f818000u),  // a tie, odd below: rounds up
                          bitsFloat(0x3f808001u),
                          std::numeric_limits<float>::max(),  // rounds to infinity
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          bitsFloat(0x00018000u),
                          INFINITY,
                          -INFINITY,
                          NAN,
                          bitsFloat(0xff800001u),  // a signalling NaN: quietened
                          bitsFloat(0x7fffffffu)};
  std::mt19937 rng(3);
  for (int i = 0; i < 10000; ++i) v.push_back(bitsFloat(static_cast<uint32_t>(rng())));
  int checked = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaAvailable(isa)) continue;
    const KernelTable& table = kernelsFor(isa);
    SCOPED_TRACE(table.name);
    // Odd offsets and lengths: unaligned vectors and scalar tails.
    for (size_t skip : {size_t{0}, size_t{3}}) {
      const size_t n = v.size() - skip;
      std::vector<uint16_t> narrow(n);
      table.narrowToBf16(v.data() + skip, narrow.data(), n);
      std::vector<float> wide(n);
      table.widenBf16(narrow.data(), wide.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(narrow[i], floatToBf16(v[skip + i]))
            << "value " << skip + i << " bits " << floatBits(v[skip + i]);
        ASSERT_EQ(floatBits(wide[i]), static_cast<uint32_t>(narrow[i]) << 16);
      }
      if (skip == 0) {
        EXPECT_EQ(narrow[3], 0x3f80u);
        EXPECT_EQ(narrow[4], 0x3f82u);
        EXPECT_TRUE(std::isnan(wide[13]));
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace squall::codec
