// The multi-threaded codec against the single-thread one: for every codec,
// implementation, input dtype, block size, residual on/off and a set of
// lengths that cut pieces unevenly (and leave a partial last block), the
// encoded bytes, the residuals, the decoded and decode-accumulated floats and
// the finite flag must be identical at 2, 3, 4 and 8 threads. Also through
// the public codec::encode / decode, with a non-finite block in the last
// piece, and with the pool busy (a second caller runs alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/kernels.h"
#include "src/codec/numeric.h"
#include "src/codec/parallel.h"

namespace squall::codec {
namespace {

struct Encoded {
  std::vector<uint8_t> payload;
  std::vector<float> residual, decoded, accumulated;
  bool finite = true;
};

std::vector<uint8_t> makeInput(DType dtype, size_t count, uint32_t seed, bool nonFiniteTail) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> x(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    float v = normal(rng) * (i % 7 == 0 ? 100.0f : 1.0f);
    if (nonFiniteTail && i == count - 5) v = INFINITY;
    if (dtype == DType::kF32) {
      std::memcpy(x.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? floatToHalf(v) : floatToBf16(v);
      std::memcpy(x.data() + 2 * i, &h, 2);
    }
  }
  return x;
}

Encoded run(const CodecKernels& k, const Spec& spec, DType dtype, const std::vector<uint8_t>& x,
            size_t count, bool ef, int threads) {
  Layout layout;
  EXPECT_EQ(layoutFor(spec, count, &layout), Status::kOk);
  Encoded out;
  out.payload.assign(layout.payloadBytes, 0xa5);
  std::vector<float> residualIn(count);
  for (size_t i = 0; i < count; ++i) residualIn[i] = static_cast<float>(i % 13) * 1e-3f - 6e-3f;
  out.residual.assign(count, -1.0f);
  const EncodeJob job{x.data(),
                      dtype,
                      count,
                      spec,
                      layout,
                      ef ? residualIn.data() : nullptr,
                      ef ? out.residual.data() : nullptr,
                      out.payload.data()};
  out.finite = parallelEncode(k.encode, job, threads);
  out.decoded.assign(count, 7.0f);
  parallelDecode(k.decode, DecodeJob{out.payload.data(), count, spec, layout, out.decoded.data()},
                 threads);
  out.accumulated.assign(count, 0.25f);
  parallelDecode(k.accumulate,
                 DecodeJob{out.payload.data(), count, spec, layout, out.accumulated.data()},
                 threads);
  return out;
}

// Bit patterns, so NaNs compare equal to themselves.
std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

class CodecThreads : public testing::Test {
 protected:
  void TearDown() override { setCodecThreads(0); }
};

TEST_F(CodecThreads, PiecesFollowTheMinimum) {
  const size_t m = minElementsPerThread();
  EXPECT_EQ(piecesFor(2 * m - 1, 8), 1);
  EXPECT_EQ(piecesFor(2 * m, 8), 2);
  EXPECT_EQ(piecesFor(100 * m, 8), 8);
  EXPECT_EQ(piecesFor(100 * m, 1), 1);
}

TEST_F(CodecThreads, KernelsGiveTheSingleThreadBytes) {
  const size_t m = minElementsPerThread();
  // Uneven cuts, a partial last block, a partial last 64-bit word.
  const size_t counts[] = {2 * m, 3 * m + 77, 8 * m + size_t{2048} * 3 + 5};
  int checked = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaAvailable(isa)) continue;
    const KernelTable& table = kernelsFor(isa);
    for (int c = 0; c < kNumCodecs; ++c) {
      const auto codec = static_cast<CodecId>(c);
      for (uint32_t block : {64u, 2048u, 65536u}) {
        if (!usesBlocks(codec) && block != 2048u) continue;
        for (DType dtype : {DType::kF32, DType::kBf16}) {
          for (size_t count : counts) {
            for (bool ef : {true, false}) {
              const Spec spec{codec, Scale::kMeanAbs, block};
              const auto x = makeInput(dtype, count, static_cast<uint32_t>(count + block), false);
              const CodecKernels& k = table.codecs[c];
              const Encoded one = run(k, spec, dtype, x, count, ef, 1);
              for (int threads : {2, 3, 4, 8}) {
                SCOPED_TRACE(testing::Message()
                             << table.name << " " << codecName(codec) << " block " << block
                             << " count " << count << " ef " << ef << " threads " << threads);
                const Encoded many = run(k, spec, dtype, x, count, ef, threads);
                ASSERT_EQ(many.payload, one.payload);
                if (ef) {
                  ASSERT_EQ(bits(many.residual), bits(one.residual));
                }
                ASSERT_EQ(bits(many.decoded), bits(one.decoded));
                ASSERT_EQ(bits(many.accumulated), bits(one.accumulated));
                ASSERT_EQ(many.finite, one.finite);
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

// Through the public API, as the collectives call it: whole encodings
// (header and padding included) and committed residuals.
Encoded apiRun(const Spec& spec, const std::vector<uint8_t>& x, size_t count, int threads) {
  setCodecThreads(threads);
  std::unique_ptr<Residual> residual;
  EXPECT_EQ(Residual::create(count, &residual), Status::kOk);
  size_t bytes = 0;
  EXPECT_EQ(encodedSize(spec, count, &bytes), Status::kOk);
  Encoded out;
  out.payload.assign(bytes, 0x5a);
  EncodeResult result;
  // Two calls, so the second reads the residual the first committed.
  for (int call = 0; call < 2; ++call) {
    EXPECT_EQ(encode(spec, x.data(), DType::kF32, count, residual.get(), out.payload.data(), bytes,
                     &result),
              Status::kOk);
  }
  out.finite = result.finite;
  out.residual.assign(residual->current(), residual->current() + count);
  out.decoded.assign(count, 0.0f);
  EXPECT_EQ(decode(out.payload.data(), bytes, out.decoded.data(), count), Status::kOk);
  out.accumulated.assign(count, 1.5f);
  EXPECT_EQ(decodeAccumulate(out.payload.data(), bytes, out.accumulated.data(), count),
            Status::kOk);
  return out;
}

TEST_F(CodecThreads, PublicApiGivesTheSingleThreadBytes) {
  const size_t count = 6 * minElementsPerThread() + 2048 + 31;
  for (bool nonFinite : {false, true}) {
    const auto x = makeInput(DType::kF32, count, 99, nonFinite);
    for (CodecId codec :
         {CodecId::kOnebit, CodecId::kInt8, CodecId::kInt4, CodecId::kInt2, CodecId::kFp16}) {
      const Spec spec{codec, Scale::kRms, kDefaultBlock};
      const Encoded one = apiRun(spec, x, count, 1);
      EXPECT_EQ(one.finite, !nonFinite);
      for (int threads : {2, 4, 8}) {
        SCOPED_TRACE(testing::Message()
                     << codecName(codec) << " threads " << threads << " nonfinite " << nonFinite);
        const Encoded many = apiRun(spec, x, count, threads);
        EXPECT_EQ(many.payload, one.payload);
        EXPECT_EQ(bits(many.residual), bits(one.residual));
        EXPECT_EQ(bits(many.decoded), bits(one.decoded));
        EXPECT_EQ(bits(many.accumulated), bits(one.accumulated));
        EXPECT_EQ(many.finite, one.finite);
      }
    }
  }
}

// Callers on several threads at once (ranks as threads share the pool): the
// ones that find it busy run alone, and every result is still identical.
TEST_F(CodecThreads, ConcurrentCallersGetIdenticalBytes) {
  const size_t count = 8 * minElementsPerThread() + 100;
  const auto x = makeInput(DType::kF32, count, 7, false);
  const Spec spec{CodecId::kOnebit, Scale::kMeanAbs, kDefaultBlock};
  setCodecThreads(1);
  size_t bytes = 0;
  ASSERT_EQ(encodedSize(spec, count, &bytes), Status::kOk);
  std::vector<uint8_t> expected(bytes);
  EncodeResult result;
  ASSERT_EQ(encode(spec, x.data(), DType::kF32, count, nullptr, expected.data(), bytes, &result),
            Status::kOk);
  setCodecThreads(4);
  std::vector<std::vector<uint8_t>> got(4, std::vector<uint8_t>(bytes));
  std::vector<std::thread> callers;
  for (size_t t = 0; t < got.size(); ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        EncodeResult r;
        if (encode(spec, x.data(), DType::kF32, count, nullptr, got[t].data(), bytes, &r) !=
            Status::kOk)
          got[t].clear();
      }
    });
  }
  for (std::thread& c : callers) c.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

TEST_F(CodecThreads, DefaultDividesTheCoresAmongLocalRanks) {
  for (const char* v : {"SQUALL_CODEC_THREADS", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << v << " is set; the default is not in use";
  setCodecThreads(0);
  const int cores = affinityCores();
  ASSERT_GE(cores, 1);
  EXPECT_EQ(codecThreads(), std::min(cores, 64));
  setLocalRanks(cores * 2);  // more ranks than cores: one thread each, never zero
  EXPECT_EQ(codecThreads(), 1);
  setLocalRanks(1);  // the largest count seen is kept
  EXPECT_EQ(codecThreads(), 1);
  setCodecThreads(3);
  EXPECT_EQ(codecThreads(), 3);
}

// Small residuals are allocated and zeroed, large ones (128 KiB and more)
// mapped from zero pages; both must start at zero, keep what an encode wrote
// across commits, and read as zeros again after reset().
TEST(Residual, StartsAndResetsToZeroAtEverySize) {
  for (size_t count : {size_t{1}, size_t{1000}, size_t{32767}, size_t{32768}, size_t{400001}}) {
    std::unique_ptr<Residual> r;
    ASSERT_EQ(Residual::create(count, &r), Status::kOk) << count;
    auto zeros = [&](const float* p) {
      return std::all_of(p, p + count, [](float v) { return v == 0.0f; });
    };
    EXPECT_TRUE(zeros(r->current()) && zeros(r->next())) << count;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->current()) % 64, 0u) << count;
    std::fill(r->next(), r->next() + count, 1.5f);
    r->commit(true);
    EXPECT_EQ(r->current()[count - 1], 1.5f) << count;
    std::fill(r->next(), r->next() + count, -2.0f);
    r->commit(false);
    EXPECT_EQ(r->current()[0], 1.5f) << count;
    EXPECT_EQ(r->skipped(), 1u) << count;
    r->reset();
    EXPECT_TRUE(zeros(r->current()) && zeros(r->next())) << count;
    EXPECT_EQ(r->skipped(), 0u) << count;
    // Writable again after the reset dropped the pages.
    std::fill(r->next(), r->next() + count, 3.0f);
    r->commit(true);
    EXPECT_EQ(r->current()[count / 2], 3.0f) << count;
  }
}

}  // namespace
}  // namespace squall::codec
