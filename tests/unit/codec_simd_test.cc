// The SIMD kernel tables against the scalar reference, through the kernel
// table itself: encoded bytes, residualOut, decoded and decode-accumulated
// floats must be bit-identical, and the finite flag must agree, for every
// codec, input dtype, residual on/off, scale kind, block size, tail length,
// pointer misalignment, cached or streaming stores and a mix of special
// values.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/codec/kernels.h"
#include "src/codec/numeric.h"

namespace squall::codec {
namespace {

constexpr size_t kHuge = (size_t{1} << 20) + 3;
constexpr uint8_t kFill = 0xa5;  // what the kernels must leave alone looks like this

// What the input holds besides ordinary values.
enum class Data {
  kPlain,      // finite, moderate
  kEdge,       // + zero blocks, -0.0, denormals, huge finite values
  kNonFinite,  // + an infinite block and a NaN block
};

struct Case {
  Isa isa;
  CodecId codec;
  DType dtype;
  bool ef;
  Scale scale;
  size_t count;
  Data data;
};

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

const char* dtypeName(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBf16: return "bf16";
  }
  return "?";
}

const char* dataName(Data d) {
  switch (d) {
    case Data::kPlain: return "plain";
    case Data::kEdge: return "edge";
    case Data::kNonFinite: return "nonfinite";
  }
  return "?";
}

std::string caseName(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = std::string(isaName(c.isa)) + "_" + codecName(c.codec) + "_" +
                     dtypeName(c.dtype) + (c.ef ? "_ef" : "_noef");
  if (c.codec == CodecId::kOnebit) name += c.scale == Scale::kRms ? "_rms" : "_meanabs";
  return name + "_n" + std::to_string(c.count) + "_" + dataName(c.data);
}

// A buffer whose data starts `offset` bytes past a 64-byte boundary, so the
// kernels see every misalignment; kGuard bytes after the end catch overruns.
class Buffer {
 public:
  static constexpr size_t kGuard = 64;
  Buffer(size_t bytes, size_t offset) : storage_(bytes + offset + kGuard + 64, kFill) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - base % 64) % 64) + offset;
    bytes_ = bytes;
  }
  uint8_t* data() { return data_; }
  float* floats() { return reinterpret_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }
  bool guardIntact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (data_[bytes_ + i] != kFill) return false;
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  uint8_t* data_;
  size_t bytes_;
};

// Blocks tried for `count` elements: every power of two from 64 to 2^16 and
// one block holding the whole buffer.
std::vector<uint32_t> blocksFor(const Case& c) {
  if (!usesBlocks(c.codec)) return {kDefaultBlock};
  uint32_t whole = kMinBlock;
  while (whole < c.count) whole *= 2;
  std::vector<uint32_t> blocks;
  // The huge size dominates the run time (the debug reference is slow): it
  // gets one block size, the default or the whole buffer.
  if (c.count == kHuge) return {c.ef ? kDefaultBlock : whole};
  for (uint32_t b = kMinBlock; b <= (1u << 16); b *= 2) blocks.push_back(b);
  if (whole > blocks.back()) blocks.push_back(whole);
  return blocks;
}

// ---- test data -----------------------------------------------------------

struct Inputs {
  std::vector<uint8_t> x;  // count elements of the case's dtype
  std::vector<float> e;    // residual in
  std::vector<float> acc;  // starting accumulator
};

float specialValue(std::mt19937& rng, Data data) {
  static const float kEdge[] = {0.0f, -0.0f, 1e-40f, -3e-42f, 1e30f, -2e29f, 65504.0f, 6e-8f};
  static const float kNonFinite[] = {INFINITY, -INFINITY, NAN};
  if (data == Data::kNonFinite && rng() % 4 == 0) return kNonFinite[rng() % 3];
  return kEdge[rng() % (sizeof(kEdge) / sizeof(kEdge[0]))];
}

void storeInput(DType dtype, std::vector<uint8_t>& x, size_t i, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(x.data() + 4 * i, &v, 4);
  } else {
    const uint16_t h = dtype == DType::kF16 ? floatToHalf(v) : floatToBf16(v);
    std::memcpy(x.data() + 2 * i, &h, 2);
  }
}

// Block-structured specials use the smallest block tried (64), so that every
// larger block contains them too.
Inputs makeInputs(const Case& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.count * 131 + static_cast<size_t>(c.dtype) * 7 +
                                         static_cast<int>(c.data)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6);
  Inputs in;
  const size_t n = c.count;
  in.x.resize(n * dtypeSize(c.dtype));
  in.e.resize(n);
  in.acc.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float v = normal(rng) * std::ldexp(1.0f, exponent(rng));
    float e = normal(rng) * 0.25f;
    float a = normal(rng);
    if (c.data != Data::kPlain) {
      if (rng() % 16 == 0) v = specialValue(rng, Data::kEdge);
      if (rng() % 32 == 0) e = specialValue(rng, Data::kEdge);
      if (rng() % 32 == 0) a = rng() % 2 ? -0.0f : bitsFloat(0x7fc00000u);
      const size_t block64 = i / 64;
      if (block64 == 1 || block64 == 4) v = e = (i % 3 == 0) ? -0.0f : 0.0f;  // zero blocks
      // Blocks of the smallest denormals (z = e with error feedback, x = e
      // in fp32): max|z| / L rounds to a zero scale while z is not zero
      // (block 6, at most 3 ulp: int4 and int8) or to a scale of a few ulp.
      if (block64 == 6 || block64 == 8) {
        const uint32_t ulps = static_cast<uint32_t>(i % (block64 == 6 ? 4 : 5));
        e = bitsFloat(ulps) * (i % 2 ? -1.0f : 1.0f);
        v = c.dtype == DType::kF32 ? e : 0.0f;
      }
      // Halves from -7 to 7 with no residual: z / s lands on ties (x.5) that
      // round to even, for every L.
      if (block64 == 7) {
        v = static_cast<float>(static_cast<int>((i * 5) % 29) - 14) * 0.5f;
        e = 0.0f;
      }
      if (c.data == Data::kNonFinite) {
        if (block64 == 2 && i % 7 == 3) v = i % 2 ? INFINITY : -INFINITY;
        if (block64 == 3 && i % 11 == 5) v = NAN;
        if (block64 == 5 && i == 5 * 64 + 9) e = INFINITY;
      }
    }
    storeInput(c.dtype, in.x, i, v);
    in.e[i] = e;
    in.acc[i] = a;
  }
  return in;
}

// ---- comparisons ---------------------------------------------------------

::testing::AssertionResult sameBytes(const uint8_t* want, const uint8_t* got, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    if (want[i] != got[i]) {
      char msg[128];
      std::snprintf(msg, sizeof(msg), "byte %zu of %zu: scalar 0x%02x, simd 0x%02x", i, bytes,
                    want[i], got[i]);
      return ::testing::AssertionFailure() << msg;
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult sameFloats(const float* want, const float* got, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t w = floatBits(want[i]);
    const uint32_t g = floatBits(got[i]);
    if (w != g) {
      char msg[160];
      std::snprintf(msg, sizeof(msg), "element %zu of %zu: scalar 0x%08x (%g), simd 0x%08x (%g)", i,
                    n, w, static_cast<double>(want[i]), g, static_cast<double>(got[i]));
      return ::testing::AssertionFailure() << msg;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- the round trip through both tables ------------------------------------

class CodecSimdTest : public testing::TestWithParam<Case> {};

TEST_P(CodecSimdTest, MatchesScalar) {
  const Case& c = GetParam();
  if (!isaAvailable(c.isa))
    GTEST_SKIP() << isaName(c.isa) << " is not available on this CPU (or not built in)";
  const KernelTable& ref = scalarKernels();
  const KernelTable& simd = kernelsFor(c.isa);
  ASSERT_STREQ(simd.name, isaName(c.isa));
  const CodecKernels& want = ref.codecs[static_cast<int>(c.codec)];
  const CodecKernels& got = simd.codecs[static_cast<int>(c.codec)];
  const Inputs in = makeInputs(c);
  const size_t n = c.count;
  const std::vector<uint32_t> blocks = blocksFor(c);

  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const Spec spec{c.codec, c.scale, blocks[bi]};
    Layout layout;
    ASSERT_EQ(layoutFor(spec, n, &layout), Status::kOk);
    // Byte offsets 1..7 for the byte-addressed buffers; float buffers either
    // vector-aligned or 4 bytes off.
    const size_t inOffset = 1 + (bi * 3 + n) % 7;
    const size_t payloadOffset = 1 + (bi * 5 + 1) % 7;
    const size_t floatOffset = bi % 2 == 0 ? 4 : 0;
    SCOPED_TRACE(testing::Message()
                 << "block " << spec.block << ", input offset " << inOffset << ", payload offset "
                 << payloadOffset << ", float offset " << floatOffset);

    Buffer x(in.x.size(), inOffset);
    std::memcpy(x.data(), in.x.data(), in.x.size());
    Buffer e(n * 4, floatOffset);
    std::memcpy(e.data(), in.e.data(), n * 4);
    Buffer wantPayload(layout.payloadBytes, payloadOffset);
    Buffer gotPayload(layout.payloadBytes, payloadOffset);
    Buffer wantE(n * 4, floatOffset);
    Buffer gotE(n * 4, floatOffset);

    EncodeJob job{x.data(), c.dtype,           n, spec, layout, c.ef ? e.floats() : nullptr,
                  nullptr,  wantPayload.data()};
    job.residualOut = c.ef ? wantE.floats() : nullptr;
    const bool wantFinite = want.encode(job);
    job.payload = gotPayload.data();
    job.residualOut = c.ef ? gotE.floats() : nullptr;
    const bool gotFinite = got.encode(job);

    ASSERT_EQ(wantFinite, gotFinite);
    if (c.data == Data::kPlain) {
      ASSERT_TRUE(wantFinite) << "plain data should encode finitely";
    }
    ASSERT_TRUE(sameBytes(wantPayload.data(), gotPayload.data(), layout.payloadBytes))
        << "encoded payload";
    ASSERT_TRUE(gotPayload.guardIntact()) << "encode wrote past the payload";
    if (c.ef) {
      ASSERT_TRUE(sameFloats(wantE.floats(), gotE.floats(), n)) << "residualOut";
      ASSERT_TRUE(gotE.guardIntact()) << "encode wrote past residualOut";
      // Streaming stores (taken where residualOut is 64-byte aligned, every
      // other block size here) write the same residual and bytes.
      Buffer streamE(n * 4, floatOffset);
      Buffer streamPayload(layout.payloadBytes, payloadOffset);
      job.payload = streamPayload.data();
      job.residualOut = streamE.floats();
      job.stream = true;
      ASSERT_EQ(got.encode(job), wantFinite);
      job.stream = false;
      ASSERT_TRUE(sameBytes(wantPayload.data(), streamPayload.data(), layout.payloadBytes))
          << "encoded payload, streaming residual stores";
      ASSERT_TRUE(sameFloats(wantE.floats(), streamE.floats(), n))
          << "residualOut, streaming stores";
      ASSERT_TRUE(streamE.guardIntact()) << "a streaming encode wrote past residualOut";
    }

    // Decode and accumulate the reference's payload with both tables.
    DecodeJob djob{wantPayload.data(), n, spec, layout, nullptr};
    for (const bool accumulate : {false, true}) {
      Buffer wantOut(n * 4, floatOffset);
      Buffer gotOut(n * 4, floatOffset);
      if (accumulate) {
        std::memcpy(wantOut.data(), in.acc.data(), n * 4);
        std::memcpy(gotOut.data(), in.acc.data(), n * 4);
      }
      djob.output = wantOut.floats();
      (accumulate ? want.accumulate : want.decode)(djob);
      djob.output = gotOut.floats();
      (accumulate ? got.accumulate : got.decode)(djob);
      ASSERT_TRUE(sameFloats(wantOut.floats(), gotOut.floats(), n))
          << (accumulate ? "decode-accumulate" : "decode");
      ASSERT_TRUE(gotOut.guardIntact()) << "decode wrote past the output";
    }
    Buffer streamOut(n * 4, floatOffset);
    djob.output = streamOut.floats();
    djob.stream = true;
    got.decode(djob);
    Buffer cachedOut(n * 4, floatOffset);
    djob.output = cachedOut.floats();
    djob.stream = false;
    want.decode(djob);
    ASSERT_TRUE(sameFloats(cachedOut.floats(), streamOut.floats(), n))
        << "decode with streaming stores";
    ASSERT_TRUE(streamOut.guardIntact()) << "a streaming decode wrote past the output";
  }
}

std::vector<Case> allCases() {
  const Isa isas[] = {Isa::kAvx2, Isa::kAvx512};
  const CodecId codecs[] = {CodecId::kNone, CodecId::kOnebit, CodecId::kFp16, CodecId::kBf16,
                            CodecId::kInt8, CodecId::kInt2,   CodecId::kInt4};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBf16};
  // 1, 63, 65, 66, 2047, 2049: the integer codecs' last byte is cut short
  // (int2 packs four elements a byte, int4 two); 66 and 2047 also end mid-run
  // of the SIMD kernels' 32 and 64 elements.
  const size_t counts[] = {1, 63, 64, 65, 66, 2047, 2048, 2049, kHuge};
  const Data datas[] = {Data::kPlain, Data::kEdge, Data::kNonFinite};
  std::vector<Case> cases;
  for (Isa isa : isas)
    for (CodecId codec : codecs)
      for (DType dtype : dtypes)
        for (bool ef : {true, false})
          for (Scale scale : {Scale::kMeanAbs, Scale::kRms}) {
            if (codec != CodecId::kOnebit && scale == Scale::kRms) continue;
            for (size_t count : counts)
              for (Data data : datas) {
                // The huge size is about long runs of blocks, not special
                // values or element-wise codecs; it also dominates the run time.
                const bool intCodec =
                    codec == CodecId::kInt8 || codec == CodecId::kInt2 || codec == CodecId::kInt4;
                const bool blockCodec =
                    codec == CodecId::kOnebit || (intCodec && dtype == DType::kF32);
                if (count == kHuge && (data != Data::kPlain || !blockCodec)) continue;
                cases.push_back({isa, codec, dtype, ef, scale, count, data});
              }
          }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecSimdTest, testing::ValuesIn(allCases()), caseName);

// ---- decoding arbitrary payloads -------------------------------------------

// Payloads the encoder never writes (negative, denormal, NaN-with-payload
// scales; random codes) must decode identically too.
struct DecodeCase {
  Isa isa;
  CodecId codec;
  size_t count;
  uint32_t block;
};

std::string decodeCaseName(const testing::TestParamInfo<DecodeCase>& info) {
  const DecodeCase& c = info.param;
  return std::string(isaName(c.isa)) + "_" + codecName(c.codec) + "_n" + std::to_string(c.count) +
         "_b" + std::to_string(c.block);
}

class CodecSimdDecodeTest : public testing::TestWithParam<DecodeCase> {};

TEST_P(CodecSimdDecodeTest, RandomPayloadMatchesScalar) {
  const DecodeCase& c = GetParam();
  if (!isaAvailable(c.isa))
    GTEST_SKIP() << isaName(c.isa) << " is not available on this CPU (or not built in)";
  const CodecKernels& want = scalarKernels().codecs[static_cast<int>(c.codec)];
  const CodecKernels& got = kernelsFor(c.isa).codecs[static_cast<int>(c.codec)];
  const Spec spec{c.codec, Scale::kMeanAbs, c.block};
  Layout layout;
  ASSERT_EQ(layoutFor(spec, c.count, &layout), Status::kOk);

  std::mt19937 rng(static_cast<uint32_t>(c.count + c.block));
  Buffer payload(layout.payloadBytes, 3);
  for (size_t i = 0; i < layout.payloadBytes; ++i) payload.data()[i] = static_cast<uint8_t>(rng());
  static const uint32_t kScales[] = {0x3f800000u, 0xbf800000u, 0x00000000u, 0x80000000u,
                                     0x00000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                     0xffc00001u, 0x7f800001u, 0x7f7fffffu, 0x3e99999au};
  for (size_t b = 0; b < layout.blocks; ++b) {
    const uint32_t s = kScales[rng() % (sizeof(kScales) / sizeof(kScales[0]))];
    std::memcpy(payload.data() + 4 * b, &s, 4);
  }
  std::vector<float> acc(c.count);
  for (size_t i = 0; i < c.count; ++i)
    acc[i] = static_cast<float>(static_cast<int>(rng() % 200) - 100);

  for (const bool accumulate : {false, true}) {
    Buffer wantOut(c.count * 4, 4);
    Buffer gotOut(c.count * 4, 4);
    std::memcpy(wantOut.data(), acc.data(), c.count * 4);
    std::memcpy(gotOut.data(), acc.data(), c.count * 4);
    DecodeJob job{payload.data(), c.count, spec, layout, wantOut.floats()};
    (accumulate ? want.accumulate : want.decode)(job);
    job.output = gotOut.floats();
    (accumulate ? got.accumulate : got.decode)(job);
    ASSERT_TRUE(sameFloats(wantOut.floats(), gotOut.floats(), c.count))
        << (accumulate ? "decode-accumulate" : "decode");
    ASSERT_TRUE(gotOut.guardIntact());
  }
}

std::vector<DecodeCase> decodeCases() {
  std::vector<DecodeCase> cases;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (CodecId codec : {CodecId::kNone, CodecId::kOnebit, CodecId::kFp16, CodecId::kBf16,
                          CodecId::kInt8, CodecId::kInt2, CodecId::kInt4})
      for (size_t count : {size_t{1}, size_t{100}, size_t{103}, size_t{4097}})
        for (uint32_t block : {64u, 128u, 8192u}) {
          if (!usesBlocks(codec) && block != 64u) continue;
          cases.push_back({isa, codec, count, block});
        }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecSimdDecodeTest, testing::ValuesIn(decodeCases()),
                         decodeCaseName);

}  // namespace
}  // namespace squall::codec
