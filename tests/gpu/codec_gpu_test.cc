// GPU codec tests: the CUDA kernels against the scalar CPU reference.
//
// For every codec, input type, scale kind, block size and odd size, with and
// without error feedback, the device must produce the reference's encoded
// bytes, committed residual, decoded and accumulated floats. The only
// tolerated difference is the payload of a NaN that arithmetic produced from a
// non-finite input (x86 propagates NaN payloads, the GPU returns its canonical
// NaN): there, NaN must meet NaN. Also checked: the non-finite rule on the
// device (residual untouched, skipped counter incremented), graph capture and
// replay of encode + commit, the device-side header check of decode, the
// onebit decode's non-finite flag, and the fused server step (cudaServeChunk)
// against the unfused sequence it replaces. int2 and int4 also get every tail
// of a packed last byte, a non-finite block beside a finite one in the same
// warp step, and decodes of arbitrary bytes (codes no encode writes, scales
// that are zero, negative, NaN or infinite).
//
// Without a usable GPU every test that needs one is skipped and the binary
// exits 0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/cuda/cuda_codec.h"
#include "src/codec/numeric.h"

namespace squall::codec {
namespace {

std::string gNoGpuReason;  // empty when a GPU is usable

#define CUDA_OK(expr)                                                                          \
  do {                                                                                         \
    const cudaError_t cuda_ok_err_ = (expr);                                                   \
    ASSERT_EQ(cuda_ok_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(cuda_ok_err_); \
  } while (0)

// Copies that are no-ops for zero bytes (the size-0 cases pass null pointers).
cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return bytes == 0 ? cudaSuccess : cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t copyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      cudaStream_t stream) {
  return bytes == 0 ? cudaSuccess : cudaMemcpyAsync(dst, src, bytes, kind, stream);
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gNoGpuReason.empty()) GTEST_SKIP() << gNoGpuReason;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// A device allocation freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes == 0 ? 8 : bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct ResidualDeleter {
  void operator()(DeviceResidual* r) const { cudaResidualDestroy(r); }
};
using ResidualPtr = std::unique_ptr<DeviceResidual, ResidualDeleter>;

// kNonFinite puts non-finite values in blocks 0, count / 2 / block and the
// last; kNonFiniteOdd only in block 1 (the upper half-warp of int2's blocks
// of 64, whose neighbour block 0 stays finite).
enum class Fill { kRandom, kZeroBlock, kNonFinite, kNonFiniteOdd };

// Input bytes of `count` elements of `dtype`, and whether any is non-finite.
std::vector<uint8_t> makeInput(DType dtype, size_t count, uint32_t block, Fill fill,
                               uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    float v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 16) - 8);
    if (rng() % 17 == 0) v = 0.0f;
    if (rng() % 19 == 0) v = -0.0f;
    values[i] = v;
  }
  if (fill == Fill::kZeroBlock) {
    for (size_t i = 0; i < count && i < block; ++i) values[i] = (i % 2) ? 0.0f : -0.0f;
  }
  if (fill == Fill::kNonFinite && count > 0) {
    values[count / 2] = std::nanf("");
    values[count - 1] = INFINITY;
    if (count > 3) values[1] = -INFINITY;
  }
  if (fill == Fill::kNonFiniteOdd && count > 0) {
    values[std::min<size_t>(count - 1, block + 5)] = -INFINITY;
    values[std::min<size_t>(count - 1, 2 * size_t{block} - 1)] = std::nanf("");
  }
  std::vector<uint8_t> bytes(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? floatToHalf(values[i]) : floatToBf16(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

std::vector<float> randomFloats(size_t count, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& f : v) f = normal(rng);
  return v;
}

bool sameFloat(float a, float b) {
  return floatBits(a) == floatBits(b) || (std::isnan(a) && std::isnan(b));
}

bool sameHalf(uint16_t a, uint16_t b, bool bf16) {
  const auto isNan = [bf16](uint16_t h) {
    return bf16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
  };
  return a == b || (isNan(a) && isNan(b));
}

// Byte-exact, or equal up to NaN payloads in float/half fields when the input
// held non-finite values. Returns a description of the first difference.
// The bit patterns of `count` floats, to compare residuals exactly (NaN
// payloads and signed zeros included).
std::vector<uint32_t> floatBitsOf(const float* p, size_t count) {
  std::vector<uint32_t> bits(count);
  std::memcpy(bits.data(), p, count * sizeof(float));
  return bits;
}

std::string compareEncoded(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                           const Spec& spec, size_t count, bool nonFiniteInput) {
  if (want.size() != got.size()) return "sizes differ";
  if (std::memcmp(want.data(), got.data(), want.size()) == 0) return "";
  Layout l;
  if (layoutFor(spec, count, &l) != Status::kOk) return "bad layout";
  size_t firstDiff = 0;
  while (want[firstDiff] == got[firstDiff]) ++firstDiff;
  const std::string where =
      "first differing byte " + std::to_string(firstDiff) + " of " + std::to_string(want.size());
  if (!nonFiniteInput) return where + " (input was finite: bytes must match exactly)";
  const uint8_t* w = want.data() + kHeaderBytes;
  const uint8_t* g = got.data() + kHeaderBytes;
  if (std::memcmp(want.data(), got.data(), kHeaderBytes) != 0) return where + " (header)";
  for (size_t b = 0; b < l.blocks; ++b) {
    float a, c;
    std::memcpy(&a, w + 4 * b, 4);
    std::memcpy(&c, g + 4 * b, 4);
    if (!sameFloat(a, c)) return where + " (scale of block " + std::to_string(b) + ")";
  }
  const uint8_t* wd = w + l.dataOffset;
  const uint8_t* gd = g + l.dataOffset;
  switch (spec.codec) {
    case CodecId::kOnebit:
    case CodecId::kInt8:
    case CodecId::kInt2:
    case CodecId::kInt4:
      if (std::memcmp(wd, gd, l.payloadBytes - l.dataOffset) != 0) return where + " (data)";
      break;
    case CodecId::kNone:
      for (size_t i = 0; i < count; ++i) {
        float a, c;
        std::memcpy(&a, wd + 4 * i, 4);
        std::memcpy(&c, gd + 4 * i, 4);
        if (!sameFloat(a, c)) return where + " (element " + std::to_string(i) + ")";
      }
      break;
    case CodecId::kFp16:
    case CodecId::kBf16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t a, c;
        std::memcpy(&a, wd + 2 * i, 2);
        std::memcpy(&c, gd + 2 * i, 2);
        if (!sameHalf(a, c, spec.codec == CodecId::kBf16))
          return where + " (element " + std::to_string(i) + ")";
      }
      break;
  }
  if (std::memcmp(wd + l.dataBytes, gd + l.dataBytes,
                  l.payloadBytes - l.dataOffset - l.dataBytes) != 0)
    return where + " (padding)";
  return "";
}

std::string describe(const Spec& spec, DType dtype, size_t count, bool res, Fill fill) {
  static const char* dtypes[] = {"f32", "f16", "bf16"};
  static const char* fills[] = {"random", "zero-block", "non-finite", "non-finite-odd"};
  return std::string(codecName(spec.codec)) + (spec.scale == Scale::kRms ? "/rms" : "") +
         " block " + std::to_string(spec.block) + " " + dtypes[static_cast<int>(dtype)] +
         " count " + std::to_string(count) + (res ? " +residual " : " ") +
         fills[static_cast<int>(fill)];
}

// One full comparison: encode (+ commit), the committed residual, decode and
// decode-accumulate.
void checkCase(cudaStream_t stream, const Spec& spec, DType dtype, size_t count, bool withRes,
               Fill fill, uint32_t seed) {
  SCOPED_TRACE(describe(spec, dtype, count, withRes, fill));
  const std::vector<uint8_t> input = makeInput(dtype, count, spec.block, fill, seed);
  const std::vector<float> resIn = randomFloats(count, seed + 1, 0.25f);
  Layout layout;
  ASSERT_EQ(layoutFor(spec, count, &layout), Status::kOk);
  const size_t total = layout.totalBytes;

  // Reference.
  std::vector<uint8_t> want(total, 0xee);
  std::vector<float> resWant(count);
  EncodeResult ref;
  ASSERT_EQ(encodeRaw(spec, input.data(), dtype, count, withRes ? resIn.data() : nullptr,
                      withRes ? resWant.data() : nullptr, want.data(), total, &ref),
            Status::kOk);

  // Device.
  DeviceBuffer dIn(input.size()), dOut(total);
  ASSERT_NE(dIn.p, nullptr);
  ASSERT_NE(dOut.p, nullptr);
  CUDA_OK(copy(dIn.p, input.data(), input.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dOut.p, 0xee, total));  // padding must be written, not inherited
  ResidualPtr residual;
  if (withRes) {
    DeviceResidual* r = nullptr;
    ASSERT_EQ(cudaResidualCreate(count, &r), Status::kOk);
    residual.reset(r);
    CUDA_OK(copy(r->buf[0], resIn.data(), count * 4, cudaMemcpyHostToDevice));
  }
  size_t bytes = 0;
  ASSERT_EQ(cudaEncode(spec, dIn.p, dtype, count, residual.get(), dOut.p, total, stream, &bytes),
            Status::kOk);
  ASSERT_EQ(bytes, total);
  std::vector<uint8_t> got(total);
  CUDA_OK(cudaMemcpyAsync(got.data(), dOut.p, total, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  const bool nonFinite = fill == Fill::kNonFinite || fill == Fill::kNonFiniteOdd;
  const std::string diff = compareEncoded(want, got, spec, count, nonFinite);
  EXPECT_EQ(diff, "");

  if (withRes) {
    int current = -1;
    unsigned long long skipped = 99;
    ASSERT_EQ(cudaResidualQuery(*residual, stream, &current, &skipped), Status::kOk);
    std::vector<float> resGot(count);
    if (ref.finite) {
      EXPECT_EQ(current, 1);
      EXPECT_EQ(skipped, 0u);
      CUDA_OK(copy(resGot.data(), residual->buf[1], count * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; ++i) {
        if (floatBits(resGot[i]) != floatBits(resWant[i])) {
          ADD_FAILURE() << "residual " << i << ": want " << resWant[i] << " got " << resGot[i];
          break;
        }
      }
    } else {
      EXPECT_EQ(current, 0);
      EXPECT_EQ(skipped, 1u);
      CUDA_OK(copy(resGot.data(), residual->buf[0], count * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(resGot.data(), resIn.data(), count * 4), 0)
          << "a non-finite call changed the current residual";
    }
  } else {
    EXPECT_EQ(ref.finite, !nonFinite || count == 0);
  }

  // Decode and accumulate the reference bytes on both sides.
  DeviceBuffer dDec(count * 4), dErr(sizeof(int));
  CUDA_OK(cudaMemcpy(dOut.p, want.data(), total, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dErr.p, 0, sizeof(int)));
  std::vector<float> decWant(count), decGot(count);
  ASSERT_EQ(decode(want.data(), total, decWant.data(), count), Status::kOk);
  ASSERT_EQ(cudaDecode(spec, dOut.p, total, dDec.as<float>(), count, stream, dErr.as<int>()),
            Status::kOk);
  CUDA_OK(copyAsync(decGot.data(), dDec.p, count * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < count; ++i) {
    if (floatBits(decGot[i]) != floatBits(decWant[i])) {
      ADD_FAILURE() << "decoded " << i << ": want 0x" << std::hex << floatBits(decWant[i])
                    << " got 0x" << floatBits(decGot[i]);
      break;
    }
  }
  std::vector<float> acc = randomFloats(count, seed + 2, 1.0f);
  std::vector<float> accGot(count);
  CUDA_OK(copy(dDec.p, acc.data(), count * 4, cudaMemcpyHostToDevice));
  ASSERT_EQ(decodeAccumulate(want.data(), total, acc.data(), count), Status::kOk);
  ASSERT_EQ(
      cudaDecodeAccumulate(spec, dOut.p, total, dDec.as<float>(), count, stream, dErr.as<int>()),
      Status::kOk);
  CUDA_OK(copyAsync(accGot.data(), dDec.p, count * 4, cudaMemcpyDeviceToHost, stream));
  int err = -1;
  CUDA_OK(cudaMemcpyAsync(&err, dErr.p, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(err, 0);
  for (size_t i = 0; i < count; ++i) {
    if (!sameFloat(accGot[i], acc[i])) {
      ADD_FAILURE() << "accumulated " << i << ": want " << acc[i] << " got " << accGot[i];
      break;
    }
  }
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBf16};

std::vector<Spec> specsFor([[maybe_unused]] size_t count) {
  std::vector<uint32_t> blocks;
  for (uint32_t b = kMinBlock; b <= 65536; b *= 2) {
#if defined(SQUALL_CUDA_EMULATION)
    // Every kernel path: segments of 32, 8 and 1 blocks, and the two-pass kernel.
    if (b == 64 || b == 256 || b == 2048 || b == 4096) blocks.push_back(b);
#else
    if (count < 100000 || b == 64 || b == 2048 || b == 65536) blocks.push_back(b);
#endif
  }
  std::vector<Spec> specs;
  for (uint32_t b : blocks) {
    specs.push_back({CodecId::kOnebit, Scale::kMeanAbs, b});
    specs.push_back({CodecId::kOnebit, Scale::kRms, b});
    specs.push_back({CodecId::kInt8, Scale::kMeanAbs, b});
    specs.push_back({CodecId::kInt4, Scale::kMeanAbs, b});
    specs.push_back({CodecId::kInt2, Scale::kMeanAbs, b});
  }
  specs.push_back({CodecId::kNone, Scale::kMeanAbs, kDefaultBlock});
  specs.push_back({CodecId::kFp16, Scale::kMeanAbs, kDefaultBlock});
  specs.push_back({CodecId::kBf16, Scale::kMeanAbs, kDefaultBlock});
  return specs;
}

class GpuSizes : public Gpu, public ::testing::WithParamInterface<size_t> {};

TEST_P(GpuSizes, MatchesScalarReference) {
  const size_t count = GetParam();
  uint32_t seed = static_cast<uint32_t>(count * 7919);
  for (const Spec& spec : specsFor(count)) {
    for (DType dtype : kDtypes) {
      for (bool res : {false, true}) {
        checkCase(stream_, spec, dtype, count, res, Fill::kRandom, ++seed);
        if (HasFatalFailure() || HasFailure()) return;  // one case is enough to read
      }
    }
  }
}

TEST_P(GpuSizes, ZeroAndNonFiniteBlocks) {
  const size_t count = GetParam();
  if (count > 100000) GTEST_SKIP() << "covered at smaller sizes";
  uint32_t seed = static_cast<uint32_t>(count * 104729);
  for (const Spec& spec : specsFor(count)) {
    for (DType dtype : kDtypes) {
      for (bool res : {false, true}) {
        for (Fill fill : {Fill::kZeroBlock, Fill::kNonFinite, Fill::kNonFiniteOdd}) {
          if (fill == Fill::kNonFiniteOdd && intLevels(spec.codec) == 0) continue;
          checkCase(stream_, spec, dtype, count, res, fill, ++seed);
          if (HasFatalFailure() || HasFailure()) return;
        }
      }
    }
  }
}

#if defined(SQUALL_CUDA_EMULATION)
// The CPU emulation runs one OS thread per CUDA thread: keep the sizes small.
INSTANTIATE_TEST_SUITE_P(Counts, GpuSizes,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{65}, size_t{2049}));
#else
INSTANTIATE_TEST_SUITE_P(Counts, GpuSizes,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65},
                                           size_t{2047}, size_t{2049}, (size_t{1} << 20) + 3));
#endif

// int2 and int4 pack 4 and 2 elements per byte: every tail of a last byte (1
// to 4 elements), a last block of one byte, each segment shape (int2 in blocks
// of 64 is two blocks per warp step, of 128 one; int4 in 64 one) and the
// warp-per-block kernel, with a non-finite block beside finite ones.
TEST_F(Gpu, IntegerCodecTails) {
  uint32_t seed = 31337;
#if defined(SQUALL_CUDA_EMULATION)
  const size_t counts[] = {2, 3, 67, 130, 2051};
  const uint32_t blocks[] = {64, 128, 4096};
#else
  const size_t counts[] = {2, 3, 4, 5, 66, 67, 127, 130, 2050, 2051, 4099, 8190, 100001};
  const uint32_t blocks[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
#endif
  for (CodecId codec : {CodecId::kInt2, CodecId::kInt4}) {
    for (uint32_t block : blocks) {
      const Spec spec{codec, Scale::kMeanAbs, block};
      for (size_t count : counts) {
        for (DType dtype : kDtypes) {
          for (bool res : {false, true}) {
            for (Fill fill : {Fill::kRandom, Fill::kNonFiniteOdd}) {
              checkCase(stream_, spec, dtype, count, res, fill, ++seed);
              if (HasFatalFailure() || HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

// Decoding is defined for any data bytes, also the codes -L - 1 that no encode
// writes (-2 for int2, -8 for int4, -128 for int8), and for scales that are
// zero, negative, NaN or infinite: the device decodes them as the reference.
TEST_F(Gpu, IntegerDecodeOfAnyBytes) {
  std::mt19937 rng(2024);
  for (CodecId codec : {CodecId::kInt2, CodecId::kInt4, CodecId::kInt8}) {
    for (uint32_t block : {64u, 4096u}) {
      const Spec spec{codec, Scale::kMeanAbs, block};
      const size_t count = 2 * size_t{block} + 67;
      SCOPED_TRACE(describe(spec, DType::kF32, count, false, Fill::kRandom));
      Layout layout;
      ASSERT_EQ(layoutFor(spec, count, &layout), Status::kOk);
      std::vector<uint8_t> enc(layout.totalBytes, 0);
      writeHeader(spec, count, enc.data());
      uint8_t* payload = enc.data() + kHeaderBytes;
      const uint32_t scaleBits[] = {0x3f800000u, 0xbe000000u, 0x00000000u, 0x7f800000u,
                                    0x7fc00000u, 0x00000001u, 0x7f7fffffu};
      for (size_t b = 0; b < layout.blocks; ++b) {
        const uint32_t bitsB = b == 0 ? 0x40490fdbu : scaleBits[rng() % 7];
        std::memcpy(payload + 4 * b, &bitsB, 4);
      }
      for (size_t i = 0; i < layout.dataBytes; ++i) {
        payload[layout.dataOffset + i] = static_cast<uint8_t>(rng());
      }
      payload[layout.dataOffset] = 0x88;  // int4's -8 -8, int2's -2 0 -2 0, int8's -120
      const size_t total = enc.size();
      DeviceBuffer dEnc(total), dDec(count * 4);
      CUDA_OK(cudaMemcpy(dEnc.p, enc.data(), total, cudaMemcpyHostToDevice));
      std::vector<float> want(count), got(count);
      ASSERT_EQ(decode(enc.data(), total, want.data(), count), Status::kOk);
      ASSERT_EQ(cudaDecode(spec, dEnc.p, total, dDec.as<float>(), count, stream_, nullptr),
                Status::kOk);
      CUDA_OK(copyAsync(got.data(), dDec.p, count * 4, cudaMemcpyDeviceToHost, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(floatBits(got[i]), floatBits(want[i])) << "element " << i;
      }
    }
  }
}

// Two calls on one residual: a finite one commits, a non-finite one leaves the
// committed residual alone and counts a skip, all decided on the device.
void checkSkips(cudaStream_t stream, const Spec& spec) {
  const size_t count = 1000;
  const std::vector<uint8_t> good = makeInput(DType::kF32, count, spec.block, Fill::kRandom, 5);
  const std::vector<uint8_t> bad = makeInput(DType::kF32, count, spec.block, Fill::kNonFinite, 6);
  size_t total = 0;
  ASSERT_EQ(encodedSize(spec, count, &total), Status::kOk);
  DeviceBuffer dIn(count * 4), dOut(total);
  DeviceResidual* raw = nullptr;
  ASSERT_EQ(cudaResidualCreate(count, &raw), Status::kOk);
  ResidualPtr r(raw);
  std::unique_ptr<Residual> host;
  ASSERT_EQ(Residual::create(count, &host), Status::kOk);
  std::vector<uint8_t> want(total), got(total);
  size_t bytes = 0;
  for (const auto* in : {&good, &bad, &good, &bad, &bad}) {
    EncodeResult result;
    ASSERT_EQ(encode(spec, in->data(), DType::kF32, count, host.get(), want.data(), total, &result),
              Status::kOk);
    CUDA_OK(copyAsync(dIn.p, in->data(), count * 4, cudaMemcpyHostToDevice, stream));
    ASSERT_EQ(cudaEncode(spec, dIn.p, DType::kF32, count, r.get(), dOut.p, total, stream, &bytes),
              Status::kOk);
    CUDA_OK(cudaMemcpyAsync(got.data(), dOut.p, total, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(compareEncoded(want, got, spec, count, in == &bad), "");
    const float* current = nullptr;
    ASSERT_EQ(cudaResidualCurrent(*r, stream, &current), Status::kOk);
    std::vector<float> resGot(count);
    CUDA_OK(copy(resGot.data(), current, count * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(floatBitsOf(resGot.data(), count), floatBitsOf(host->current(), count));
    unsigned long long skipped = 0;
    ASSERT_EQ(cudaResidualQuery(*r, stream, nullptr, &skipped), Status::kOk);
    EXPECT_EQ(skipped, host->skipped());
  }
  EXPECT_EQ(host->skipped(), 3u);
}

TEST_F(Gpu, NonFiniteCallIsSkippedOnDevice) {
  for (CodecId codec : {CodecId::kOnebit, CodecId::kInt8, CodecId::kInt4, CodecId::kInt2}) {
    SCOPED_TRACE(codecName(codec));
    checkSkips(stream_, {codec, Scale::kMeanAbs, 256});
    if (HasFatalFailure() || HasFailure()) return;
  }
}

// encode + commit captured once in a CUDA graph and replayed: same bytes and
// residuals as the CPU running the calls one after another; a replay on
// non-finite input is skipped on the device.
TEST_F(Gpu, GraphCaptureAndReplay) {
  const Spec spec{CodecId::kOnebit, Scale::kRms, 2048};
  const size_t count = 100003;
  std::vector<uint8_t> input = makeInput(DType::kBf16, count, spec.block, Fill::kRandom, 9);
  size_t total = 0;
  ASSERT_EQ(encodedSize(spec, count, &total), Status::kOk);
  DeviceBuffer dIn(input.size()), dOut(total);
  CUDA_OK(copy(dIn.p, input.data(), input.size(), cudaMemcpyHostToDevice));
  DeviceResidual* raw = nullptr;
  ASSERT_EQ(cudaResidualCreate(count, &raw), Status::kOk);
  ResidualPtr r(raw);

  // The graph and its instance, destroyed however the test ends.
  struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~Graph() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  } g;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  size_t bytes = 0;
  const Status st =
      cudaEncode(spec, dIn.p, DType::kBf16, count, r.get(), dOut.p, total, stream_, &bytes);
  CUDA_OK(cudaStreamEndCapture(stream_, &g.graph));
  ASSERT_EQ(st, Status::kOk);
  CUDA_OK(cudaGraphInstantiate(&g.exec, g.graph, 0));

  std::unique_ptr<Residual> host;
  ASSERT_EQ(Residual::create(count, &host), Status::kOk);
  std::vector<uint8_t> want(total), got(total);
  for (int replay = 0; replay < 4; ++replay) {
    if (replay == 3) {  // poison one element: this replay must be skipped
      const uint16_t nan = 0x7fc0;
      std::memcpy(&input[size_t{2} * 777], &nan, 2);
      CUDA_OK(copyAsync(dIn.p, input.data(), input.size(), cudaMemcpyHostToDevice, stream_));
    }
    EncodeResult result;
    ASSERT_EQ(
        encode(spec, input.data(), DType::kBf16, count, host.get(), want.data(), total, &result),
        Status::kOk);
    CUDA_OK(cudaGraphLaunch(g.exec, stream_));
    CUDA_OK(cudaMemcpyAsync(got.data(), dOut.p, total, cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(compareEncoded(want, got, spec, count, replay == 3), "") << "replay " << replay;
    const float* current = nullptr;
    ASSERT_EQ(cudaResidualCurrent(*r, stream_, &current), Status::kOk);
    std::vector<float> resGot(count);
    CUDA_OK(copy(resGot.data(), current, count * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(floatBitsOf(resGot.data(), count), floatBitsOf(host->current(), count))
        << "replay " << replay;
    unsigned long long skipped = 0;
    ASSERT_EQ(cudaResidualQuery(*r, stream_, nullptr, &skipped), Status::kOk);
    EXPECT_EQ(skipped, host->skipped()) << "replay " << replay;
  }
  EXPECT_EQ(host->skipped(), 1u);
}

// A buffer whose header does not match the expectation decodes to NaN and
// raises the device error flag instead of being trusted.
TEST_F(Gpu, DecodeChecksHeaderOnDevice) {
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4, CodecId::kInt2}) {
    SCOPED_TRACE(codecName(codec));
    const Spec spec{codec, Scale::kMeanAbs, 64};
    const size_t count = 300;
    size_t total = 0;
    ASSERT_EQ(encodedSize(spec, count, &total), Status::kOk);
    const std::vector<uint8_t> input = makeInput(DType::kF32, count, spec.block, Fill::kRandom, 3);
    std::vector<uint8_t> enc(total);
    EncodeResult result;
    ASSERT_EQ(encodeRaw(spec, input.data(), DType::kF32, count, nullptr, nullptr, enc.data(), total,
                        &result),
              Status::kOk);
    enc[0] ^= 0xff;  // magic
    DeviceBuffer dEnc(total), dDec(count * 4), dErr(sizeof(int));
    CUDA_OK(cudaMemcpy(dEnc.p, enc.data(), total, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dErr.p, 0, sizeof(int)));
    ASSERT_EQ(cudaDecode(spec, dEnc.p, total, dDec.as<float>(), count, stream_, dErr.as<int>()),
              Status::kOk);
    std::vector<float> dec(count);
    int err = 0;
    CUDA_OK(copyAsync(dec.data(), dDec.p, count * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaMemcpyAsync(&err, dErr.p, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(err, 1);
    for (float f : dec) ASSERT_EQ(floatBits(f), 0x7fc00000u);
  }
}

// ---- the fused server step and the decode's non-finite flag ----------------

// A onebit encoding of `count` random values (with a random residual, so the
// pieces' scales differ), optionally with a NaN at element `nanAt`.
std::vector<uint8_t> onebitPiece(const Spec& spec, size_t count, uint32_t seed, size_t nanAt) {
  std::vector<float> x = randomFloats(count, seed, 1.0f);
  const std::vector<float> e = randomFloats(count, seed + 1, 0.5f);
  if (nanAt < count) x[nanAt] = std::nanf("");
  std::vector<float> unused(count);
  size_t total = 0;
  EXPECT_EQ(encodedSize(spec, count, &total), Status::kOk);
  std::vector<uint8_t> enc(total);
  EncodeResult result;
  EXPECT_EQ(encodeRaw(spec, x.data(), DType::kF32, count, e.data(), unused.data(), enc.data(),
                      total, &result),
            Status::kOk);
  return enc;
}

// What one server step leaves on the device: the encoding, both residual
// buffers, the control block (before the commit) and the error flag.
struct Served {
  std::vector<uint8_t> encoded;
  std::vector<float> buf[2];
  int control[2] = {-1, -1};
  int error = -1;
  int current = -1;  // after the commit
  unsigned long long skipped = 0;
};

Served readServed(cudaStream_t stream, const DeviceResidual& r, const DeviceBuffer& out,
                  size_t total, const DeviceBuffer& err) {
  Served s;
  s.encoded.resize(total);
  EXPECT_EQ(cudaMemcpyAsync(s.encoded.data(), out.p, total, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  for (int k = 0; k < 2; ++k) {
    s.buf[k].resize(r.count);
    EXPECT_EQ(
        cudaMemcpyAsync(s.buf[k].data(), r.buf[k], r.count * 4, cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
  }
  EXPECT_EQ(cudaMemcpyAsync(s.control, r.control, 2 * sizeof(int), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(&s.error, err.p, sizeof(int), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaResidualCommit(r, stream), Status::kOk);
  EXPECT_EQ(cudaResidualQuery(r, stream, &s.current, &s.skipped), Status::kOk);
  return s;
}

std::string firstResidualDifference(const std::vector<float>& want, const std::vector<float>& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (floatBits(want[i]) != floatBits(got[i])) {
      return "element " + std::to_string(i) + ": want 0x" + std::to_string(floatBits(want[i])) +
             " got 0x" + std::to_string(floatBits(got[i]));
    }
  }
  return "";
}

enum class Poison { kNone, kNonFinite, kHeader };

// cudaServeChunk against the sequence it replaces (cudaDecode of piece 0,
// cudaDecodeAccumulate of the others, division by n, cudaEncodeChunk with the
// server residual), over two steps so that both residual buffers are read:
// the same bytes, the same residual bits in both buffers, the same flags.
void checkServe(cudaStream_t stream, const Spec& spec, size_t count, int n, bool average,
                Poison poison, uint32_t seed) {
  SCOPED_TRACE(describe(spec, DType::kF32, count, true, Fill::kRandom) + " n " + std::to_string(n) +
               (average ? " avg" : " sum") +
               (poison == Poison::kNonFinite ? " non-finite piece"
                : poison == Poison::kHeader  ? " bad header"
                                             : ""));
  size_t total = 0;
  ASSERT_EQ(encodedSize(spec, count, &total), Status::kOk);
  const size_t stride = (total + 15) / 16 * 16 + 8;  // slots need not be packed
  const size_t offset = 5;                           // the chunk inside a larger residual
  const std::vector<float> res0 = randomFloats(count + offset, seed, 0.25f);
  DeviceResidual* raw[2] = {nullptr, nullptr};
  for (auto*& r : raw) {
    ASSERT_EQ(cudaResidualCreate(count + offset, &r), Status::kOk);
    CUDA_OK(copy(r->buf[0], res0.data(), res0.size() * 4, cudaMemcpyHostToDevice));
  }
  ResidualPtr unfusedRes(raw[0]), fusedRes(raw[1]);
  DeviceBuffer dPieces(stride * n), dAcc(count * 4), dUnfused(total), dFused(total);
  DeviceBuffer dErrUnfused(sizeof(int)), dErrFused(sizeof(int));
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<uint8_t> pieces(stride * n, 0xcd);
    for (int j = 0; j < n; ++j) {
      const bool poisoned = step == 1 && j == n / 2;
      const size_t nanAt = poisoned && poison == Poison::kNonFinite ? count - 1 : count;
      const std::vector<uint8_t> enc = onebitPiece(spec, count, seed + 100 * step + j, nanAt);
      std::memcpy(&pieces[j * stride], enc.data(), total);
      if (poisoned && poison == Poison::kHeader) pieces[j * stride + 8] ^= 1;  // the block
    }
    CUDA_OK(copy(dPieces.p, pieces.data(), pieces.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dUnfused.p, 0xee, total));
    CUDA_OK(cudaMemset(dFused.p, 0x11, total));  // padding must be written, not inherited
    CUDA_OK(cudaMemset(dErrUnfused.p, 0, sizeof(int)));
    CUDA_OK(cudaMemset(dErrFused.p, 0, sizeof(int)));

    for (int j = 0; j < n; ++j) {
      const uint8_t* piece = dPieces.as<uint8_t>() + j * stride;
      ASSERT_EQ(j == 0 ? cudaDecode(spec, piece, total, dAcc.as<float>(), count, stream,
                                    dErrUnfused.as<int>())
                       : cudaDecodeAccumulate(spec, piece, total, dAcc.as<float>(), count, stream,
                                              dErrUnfused.as<int>()),
                Status::kOk);
    }
    if (average) {  // divideKernel's __fdiv_rn, as IEEE division on the host
      std::vector<float> acc(count);
      CUDA_OK(copyAsync(acc.data(), dAcc.p, count * 4, cudaMemcpyDeviceToHost, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      for (float& v : acc) v = v / static_cast<float>(n);
      CUDA_OK(copyAsync(dAcc.p, acc.data(), count * 4, cudaMemcpyHostToDevice, stream));
    }
    size_t bytes = 0;
    ASSERT_EQ(cudaEncodeChunk(spec, dAcc.p, DType::kF32, count, unfusedRes.get(), offset,
                              dUnfused.p, total, stream, &bytes),
              Status::kOk);
    size_t fusedBytes = 0;
    ASSERT_EQ(cudaServeChunk(spec, dPieces.p, stride, n, total, count, average, *fusedRes, offset,
                             dFused.p, total, stream, &fusedBytes, dErrFused.as<int>()),
              Status::kOk);
    EXPECT_EQ(fusedBytes, bytes);
    const Served want = readServed(stream, *unfusedRes, dUnfused, total, dErrUnfused);
    const Served got = readServed(stream, *fusedRes, dFused, total, dErrFused);
    EXPECT_EQ(std::memcmp(want.encoded.data(), got.encoded.data(), total), 0)
        << compareEncoded(want.encoded, got.encoded, spec, count, false);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(firstResidualDifference(want.buf[k], got.buf[k]), "") << "residual buffer " << k;
    }
    EXPECT_EQ(got.control[0], want.control[0]);
    EXPECT_EQ(got.control[1], want.control[1]);
    EXPECT_EQ(got.error, want.error);
    EXPECT_EQ(got.current, want.current);
    EXPECT_EQ(got.skipped, want.skipped);
    // And what each case is meant to exercise.
    const bool bad = step == 1 && poison != Poison::kNone;
    EXPECT_EQ(want.control[1], bad ? 1 : 0) << "the non-finite flag before the commit";
    EXPECT_EQ(want.error, step == 1 && poison == Poison::kHeader ? 1 : 0);
    EXPECT_EQ(want.current, step == 0 || bad ? 1 : 0) << "a bad second step keeps buffer 1";
    EXPECT_EQ(want.skipped, bad ? 1u : 0u);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST_F(Gpu, ServeMatchesUnfusedSequence) {
  uint32_t seed = 4242;
  for (uint32_t block : {64u, 2048u}) {
    // Not multiples of the block: a short last block; 2048 also one short block.
    for (size_t count : {size_t{5} * block - 19, size_t{block} / 2 + 3}) {
      for (Scale scale : {Scale::kMeanAbs, Scale::kRms}) {
        const Spec spec{CodecId::kOnebit, scale, block};
        for (int n = 1; n <= 4; ++n) {
          for (bool average : {false, true}) {
            checkServe(stream_, spec, count, n, average, Poison::kNone, ++seed);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

TEST_F(Gpu, ServeNonFiniteAndBadHeaderLikeUnfused) {
  uint32_t seed = 777;
  for (uint32_t block : {64u, 2048u}) {
    for (Scale scale : {Scale::kMeanAbs, Scale::kRms}) {
      const Spec spec{CodecId::kOnebit, scale, block};
      for (int n : {1, 3}) {
        for (Poison poison : {Poison::kNonFinite, Poison::kHeader}) {
          checkServe(stream_, spec, 3 * size_t{block} - 7, n, n == 3, poison, ++seed);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The decode's non-finite flag is raised exactly when a block's scale is not
// finite (a scale in any block position, the last, short one included) or the
// header is wrong, and never for finite or zero scales.
TEST_F(Gpu, DecodeFlagsNonFiniteScalesOnly) {
  for (uint32_t block : {64u, 2048u}) {
    const Spec spec{CodecId::kOnebit, Scale::kMeanAbs, block};
    const size_t count = 4 * size_t{block} + 3;
    SCOPED_TRACE("block " + std::to_string(block));
    const std::vector<uint8_t> clean = onebitPiece(spec, count, block, count);
    const size_t total = clean.size();
    Layout layout;
    ASSERT_EQ(layoutFor(spec, count, &layout), Status::kOk);
    DeviceBuffer dEnc(total), dDec(count * 4), dFlag(sizeof(int));
    // (block whose scale is changed or -1, the scale's bits or 0 for the header)
    std::vector<std::pair<long, uint32_t>> cases = {{-1, 0}, {0, 0}, {-2, 0}};
    for (long b = 0; b < static_cast<long>(layout.blocks); ++b) {
      cases.push_back({b, 0x7fc00000u});
      cases.push_back({b, 0x7f800000u});  // +inf
      cases.push_back({b, 0xff800000u});  // -inf
    }
    for (const auto& [b, scaleBits] : cases) {
      std::vector<uint8_t> enc = clean;
      if (b >= 0) std::memcpy(&enc[kHeaderBytes + 4 * b], &scaleBits, 4);  // 0: a zero block
      if (b == -2) enc[kHeaderBytes - 1] ^= 0x40;                          // the count's top byte
      CUDA_OK(cudaMemcpy(dEnc.p, enc.data(), total, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(dFlag.p, 0, sizeof(int)));
      ASSERT_EQ(cudaDecode(spec, dEnc.p, total, dDec.as<float>(), count, stream_, nullptr,
                           dFlag.as<int>()),
                Status::kOk);
      std::vector<float> dec(count);
      int flag = -1;
      CUDA_OK(copyAsync(dec.data(), dDec.p, count * 4, cudaMemcpyDeviceToHost, stream_));
      CUDA_OK(cudaMemcpyAsync(&flag, dFlag.p, sizeof(int), cudaMemcpyDeviceToHost, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      bool anyNonFinite = false;
      for (float f : dec) anyNonFinite = anyNonFinite || !std::isfinite(f);
      const bool wantFlag = b == -2 || (b >= 0 && scaleBits != 0);
      EXPECT_EQ(anyNonFinite, wantFlag) << "case " << b << " 0x" << std::hex << scaleBits;
      EXPECT_EQ(flag, wantFlag ? 1 : 0) << "case " << b << " 0x" << std::hex << scaleBits;
    }
  }
}

// Host-side validation fails before touching the device, so it runs anywhere.
TEST(GpuHostValidation, RejectsBadArguments) {
  const Spec bad{CodecId::kOnebit, Scale::kMeanAbs, 100};
  size_t bytes = 0;
  alignas(8) static uint8_t out[64];
  alignas(4) static float in[4];
  EXPECT_EQ(cudaEncode(bad, in, DType::kF32, 4, nullptr, out, sizeof(out), nullptr, &bytes),
            Status::kInvalidArgument);
  const Spec good{CodecId::kOnebit, Scale::kMeanAbs, 64};
  EXPECT_EQ(cudaEncode(good, in, DType::kF32, 4, nullptr, out, 8, nullptr, &bytes),
            Status::kInvalidArgument);  // capacity
  EXPECT_EQ(cudaEncode(good, in, DType::kF32, 4, nullptr, out + 4, 60, nullptr, &bytes),
            Status::kInvalidArgument);  // alignment
  EXPECT_EQ(cudaDecode(good, out, 48, reinterpret_cast<float*>(out + 48), 4, nullptr, nullptr),
            Status::kInvalidUsage);  // wrong size for 4 elements
  int flag = 0;
  const Spec int8{CodecId::kInt8, Scale::kMeanAbs, 64};
  size_t int8Bytes = 0;
  ASSERT_EQ(encodedSize(int8, 4, &int8Bytes), Status::kOk);
  EXPECT_EQ(cudaDecode(int8, out, int8Bytes, in, 4, nullptr, nullptr, &flag),
            Status::kUnsupported);  // the non-finite flag is onebit's
  for (CodecId codec : {CodecId::kInt2, CodecId::kInt4}) {
    const Spec packed{codec, Scale::kMeanAbs, 64};
    size_t packedBytes = 0;
    ASSERT_EQ(encodedSize(packed, 4, &packedBytes), Status::kOk);
    EXPECT_EQ(cudaDecode(packed, out, packedBytes, in, 4, nullptr, nullptr, &flag),
              Status::kUnsupported);
  }
  size_t oneBytes = 0;
  ASSERT_EQ(encodedSize(good, 4, &oneBytes), Status::kOk);
  alignas(8) static uint8_t slots[256];
  uint8_t* served = slots + 128;
  DeviceResidual server;  // never touched: the arguments fail first
  server.count = 4;
  EXPECT_EQ(cudaServeChunk(int8, slots, 64, 1, int8Bytes, 4, false, server, 0, served, 128, nullptr,
                           &bytes, nullptr),
            Status::kUnsupported);
  for (CodecId codec : {CodecId::kInt2, CodecId::kInt4}) {  // unfused, as int8
    const Spec packed{codec, Scale::kMeanAbs, 64};
    size_t packedBytes = 0;
    ASSERT_EQ(encodedSize(packed, 4, &packedBytes), Status::kOk);
    EXPECT_EQ(cudaServeChunk(packed, slots, 64, 1, packedBytes, 4, false, server, 0, served, 128,
                             nullptr, &bytes, nullptr),
              Status::kUnsupported);
  }
  EXPECT_EQ(cudaServeChunk(good, slots, 64, 1, oneBytes + 8, 4, false, server, 0, served, 128,
                           nullptr, &bytes, nullptr),
            Status::kInvalidUsage);  // wrong piece size
  EXPECT_EQ(cudaServeChunk(good, slots, 8, 2, oneBytes, 4, false, server, 0, served, 128, nullptr,
                           &bytes, nullptr),
            Status::kInvalidUsage);  // pieces overlap
  EXPECT_EQ(cudaServeChunk(good, slots, 64, 1, oneBytes, 4, false, server, 1, served, 128, nullptr,
                           &bytes, nullptr),
            Status::kInvalidUsage);  // outside the residual
  EXPECT_EQ(cudaServeChunk(good, slots, 64, 1, oneBytes, 4, false, server, 0, served, 8, nullptr,
                           &bytes, nullptr),
            Status::kInvalidArgument);  // capacity
  EXPECT_EQ(cudaServeChunk(good, slots, oneBytes, 1, oneBytes, 4, false, server, 0, slots + 8, 120,
                           nullptr, &bytes, nullptr),
            Status::kInvalidUsage);  // output overlaps the piece
}

}  // namespace
}  // namespace squall::codec

int main(int argc, char** argv) {
  // The oracle is the scalar reference, whatever this CPU supports.
  setenv("SQUALL_CODEC_ISA", "scalar", 1);
  ::testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess) {
    squall::codec::gNoGpuReason =
        std::string("no usable CUDA device: cudaGetDeviceCount failed with ") +
        cudaGetErrorName(err);
  } else if (devices == 0) {
    squall::codec::gNoGpuReason = "no CUDA device present";
  }
  if (!squall::codec::gNoGpuReason.empty()) {
    std::printf("SKIP: %s; GPU tests are skipped\n", squall::codec::gNoGpuReason.c_str());
  } else {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("GPU: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  }
  return RUN_ALL_TESTS();
}
