#include "src/codec/codec.h"

#include <sys/mman.h>
#include <unistd.h>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "src/codec/kernels.h"
#include "src/codec/numeric.h"
#include "src/codec/parallel.h"
#include "src/common/log.h"
#include "src/common/params.h"

namespace squall::codec {
namespace {

// Residual buffers from this size on are mapped rather than allocated
// (codec.h): below it the zeroing is cheap and the pages are likely reused.
constexpr size_t kMappedResidualBytes = size_t{128} << 10;

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bBytes && pb < pa + aBytes;
}

// Padding bytes are part of the wire format (zero), so encodings are
// byte-for-byte reproducible.
void zeroPadding(const Layout& l, uint8_t* payload) {
  std::memset(payload + l.blocks * 4, 0, l.scalesBytes - l.blocks * 4);
  std::memset(payload + l.dataOffset + l.dataBytes, 0, l.payloadBytes - l.dataOffset - l.dataBytes);
}

// What every encoding entry asks of its caller: somewhere to put the result,
// and a residual given whole (read and write sides) or not at all.
Status checkEncodeResult(ResidualSpan residual, const EncodeResult* result) {
  SQUALL_REQUIRE(result != nullptr, Status::kInvalidArgument, Subsys::kCodec,
                 "the result pointer is NULL");
  SQUALL_REQUIRE((residual.in == nullptr) == (residual.out == nullptr), Status::kInvalidUsage,
                 Subsys::kCodec, "residual input and output must be both set or both NULL");
  return Status::kOk;
}

// Writes an encoding's header and zero padding; returns where its payload starts.
uint8_t* beginEncoding(const Spec& spec, size_t count, const Layout& layout, void* output) {
  auto* out = static_cast<uint8_t*>(output);
  writeHeader(spec, count, out);
  zeroPadding(layout, out + kHeaderBytes);
  return out + kHeaderBytes;
}

Status decodeInto(const void* input, size_t bytes, float* output, size_t count, bool accumulate,
                  Stores stores = Stores::kCached) {
  SQUALL_REQUIRE(input != nullptr || bytes == 0, Status::kInvalidArgument, Subsys::kCodec,
                 "the encoded input pointer is NULL");
  SQUALL_REQUIRE(output != nullptr || count == 0, Status::kInvalidArgument, Subsys::kCodec,
                 "the %s pointer is NULL but count is %zu", accumulate ? "accumulator" : "output",
                 count);
  Spec spec;
  size_t encodedCount = 0;
  Layout layout;
  SQUALL_TRY(readHeader(input, bytes, &spec, &encodedCount, &layout));
  SQUALL_REQUIRE(encodedCount == count, Status::kInvalidUsage, Subsys::kCodec,
                 "the encoded buffer holds %zu elements but the %s has %zu; decode each "
                 "chunk into a buffer of its own size",
                 encodedCount, accumulate ? "accumulator" : "output", count);
  SQUALL_REQUIRE(count == 0 || !overlaps(input, bytes, output, count * sizeof(float)),
                 Status::kInvalidUsage, Subsys::kCodec,
                 "the encoded input and the decoded output overlap; decode into a separate "
                 "buffer");
  if (count == 0) return Status::kOk;
  const CodecKernels& k = activeKernels().codecs[static_cast<int>(spec.codec)];
  DecodeJob job{static_cast<const uint8_t*>(input) + kHeaderBytes,
                count,
                spec,
                layout,
                output,
                stores == Stores::kStream};
  parallelDecode(accumulate ? k.accumulate : k.decode, job, codecThreads());
  return Status::kOk;
}

// Reads the headers of the n encodings of a sum: each holds `count`
// elements in `bytes`, all with one spec (*spec and *layout get it).
Status checkSum(const uint8_t* const* encodings, size_t n, size_t bytes, size_t count, Spec* spec,
                Layout* layout, const uint8_t** payloads) {
  SQUALL_REQUIRE(encodings != nullptr && n >= 1, Status::kInvalidArgument, Subsys::kCodec,
                 "a sum needs at least one encoding (got %zu, pointer %p)", n,
                 static_cast<const void*>(encodings));
  for (size_t j = 0; j < n; ++j) {
    SQUALL_REQUIRE(encodings[j] != nullptr, Status::kInvalidArgument, Subsys::kCodec,
                   "encoding %zu of a sum is NULL", j);
    Spec got;
    size_t held = 0;
    Layout l;
    SQUALL_TRY(readHeader(encodings[j], bytes, &got, &held, &l));
    SQUALL_REQUIRE(held == count, Status::kInvalidUsage, Subsys::kCodec,
                   "encoding %zu of a sum holds %zu elements where %zu were expected; sum "
                   "encodings of the same elements",
                   j, held, count);
    if (j == 0) {
      *spec = got;
      *layout = l;
    }
    SQUALL_REQUIRE(sameEncoding(got, *spec), Status::kInvalidUsage, Subsys::kCodec,
                   "encoding %zu of a sum was made with %s block %u, encoding 0 with %s block "
                   "%u; sum encodings of one spec",
                   j, codecName(got.codec), got.block, codecName(spec->codec), spec->block);
    payloads[j] = encodings[j] + kHeaderBytes;
  }
  return Status::kOk;
}

// A span's halves for the kernels (fp32 store), or for parallel.cc's tiles (bf16).
const float* f32In(const ResidualSpan& r) {
  return r.store == ResidualStore::kF32 ? static_cast<const float*>(r.in) : nullptr;
}
float* f32Out(const ResidualSpan& r) {
  return r.store == ResidualStore::kF32 ? static_cast<float*>(r.out) : nullptr;
}
Bf16Residual bf16Of(const ResidualSpan& r) {
  if (r.store != ResidualStore::kBf16) return {};
  return {static_cast<const uint16_t*>(r.in), static_cast<uint16_t*>(r.out)};
}

// The payload pointers of a sum: on the stack for the usual few ranks.
struct Payloads {
  explicit Payloads(size_t n) : heap(n > kInline ? n : 0) {}
  const uint8_t** data() { return heap.empty() ? inline_ : heap.data(); }
  static constexpr size_t kInline = 16;
  const uint8_t* inline_[kInline] = {};
  std::vector<const uint8_t*> heap;
};

}  // namespace

bool sameEncoding(const Spec& a, const Spec& b) {
  return a.codec == b.codec && (a.codec != CodecId::kOnebit || a.scale == b.scale) &&
         (!usesBlocks(a.codec) || a.block == b.block);
}

Status Residual::create(size_t count, std::unique_ptr<Residual>* out, ResidualStore store) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kCodec,
                 "the residual output pointer is NULL");
  SQUALL_REQUIRE(store == ResidualStore::kF32 || store == ResidualStore::kBf16,
                 Status::kInvalidArgument, Subsys::kCodec,
                 "a residual is stored as fp32 or bf16, not store %u",
                 static_cast<unsigned>(store));
  size_t bytes = 0;
  SQUALL_REQUIRE(!__builtin_mul_overflow(count, residualElementBytes(store), &bytes) &&
                     bytes <= SIZE_MAX / 2 - 64,
                 Status::kInvalidArgument, Subsys::kCodec,
                 "a residual of %zu elements would need more than SIZE_MAX bytes", count);
  std::unique_ptr<Residual> r(new (std::nothrow) Residual(count, store));
  SQUALL_REQUIRE(r != nullptr, Status::kOutOfMemory, Subsys::kCodec,
                 "out of memory allocating a residual object");
  const size_t padded = (bytes + 63) & ~size_t{63};
  if (padded >= kMappedResidualBytes) {
    // Zero pages from the kernel: nothing is touched until an encode writes.
    r->mappedBytes_ = padded;
    for (void*& buffer : r->buffers_) {
      void* map = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      SQUALL_REQUIRE(map != MAP_FAILED, Status::kOutOfMemory, Subsys::kCodec,
                     "out of memory mapping a residual of %zu elements (2 x %zu bytes): %s; "
                     "free memory or compress smaller buffers",
                     count, bytes, std::strerror(errno));
      buffer = map;
    }
    *out = std::move(r);
    return Status::kOk;
  }
  for (void*& buffer : r->buffers_) {
    buffer = std::aligned_alloc(64, padded == 0 ? 64 : padded);
    SQUALL_REQUIRE(buffer != nullptr, Status::kOutOfMemory, Subsys::kCodec,
                   "out of memory allocating a residual of %zu elements (2 x %zu bytes); "
                   "free memory or compress smaller buffers",
                   count, bytes);
  }
  r->reset();
  *out = std::move(r);
  return Status::kOk;
}

Residual::~Residual() {
  for (void* buffer : buffers_) {
    if (buffer == nullptr) continue;
    if (mappedBytes_ != 0) {
      munmap(buffer, mappedBytes_);
    } else {
      std::free(buffer);
    }
  }
}

void Residual::commit(bool finite) {
  if (finite)
    current_ ^= 1;
  else
    ++skipped_;
}

void Residual::reset() {
  for (void* buffer : buffers_) {
    // A mapping drops its pages instead: they read as zeros again, and the
    // next encode that writes them takes them fresh (zeroing them in place
    // here would first fault in every page never written yet).
    if (mappedBytes_ == 0 || madvise(buffer, mappedBytes_, MADV_DONTNEED) != 0)
      std::memset(buffer, 0, count_ * residualElementBytes(store_));
  }
  current_ = 0;
  skipped_ = 0;
}

ResidualSpan Residual::span(size_t at) {
  return ResidualSpan(buffers_[current_], buffers_[current_ ^ 1], store_).at(at);
}

float Residual::value(size_t i) const {
  if (store_ == ResidualStore::kBf16)
    return bf16ToFloat(static_cast<const uint16_t*>(buffers_[current_])[i]);
  return static_cast<const float*>(buffers_[current_])[i];
}

void Residual::setValue(size_t i, float value) {
  if (store_ == ResidualStore::kBf16) {
    static_cast<uint16_t*>(buffers_[current_])[i] = floatToBf16(value);
  } else {
    static_cast<float*>(buffers_[current_])[i] = value;
  }
}

void Residual::clear() {
  if (count_ != 0) std::memset(buffers_[current_], 0, count_ * residualElementBytes(store_));
}

void Residual::read(float* to, size_t n) const {
  if (store_ == ResidualStore::kF32) {
    if (n != 0) std::memcpy(to, buffers_[current_], n * sizeof(float));
    return;
  }
  widenBf16(static_cast<const uint16_t*>(buffers_[current_]), to, n);
}

void Residual::write(const float* from, size_t n) {
  if (store_ == ResidualStore::kF32) {
    if (n != 0) std::memcpy(buffers_[current_], from, n * sizeof(float));
    return;
  }
  narrowToBf16(from, static_cast<uint16_t*>(buffers_[current_]), n);
}

Status encodedSize(const Spec& spec, size_t count, size_t* bytes) {
  SQUALL_REQUIRE(bytes != nullptr, Status::kInvalidArgument, Subsys::kCodec,
                 "the size output pointer is NULL");
  Layout layout;
  SQUALL_TRY(layoutFor(spec, count, &layout));
  *bytes = layout.totalBytes;
  return Status::kOk;
}

Status checkEncodeArgs(const Spec& spec, const void* input, DType dtype, size_t count,
                       const void* output, size_t capacity, Subsys subsys, Layout* layout) {
  SQUALL_REQUIRE(static_cast<unsigned>(dtype) <= static_cast<unsigned>(DType::kBf16),
                 Status::kInvalidArgument, subsys,
                 "codecs take fp32, fp16 or bf16 input, not data type %u",
                 static_cast<unsigned>(dtype));
  SQUALL_REQUIRE(input != nullptr || count == 0, Status::kInvalidArgument, subsys,
                 "the input pointer is NULL but count is %zu", count);
  SQUALL_REQUIRE(output != nullptr, Status::kInvalidArgument, subsys, "the output pointer is NULL");
  SQUALL_TRY(layoutFor(spec, count, layout));
  SQUALL_REQUIRE(capacity >= layout->totalBytes, Status::kInvalidArgument, subsys,
                 "the output holds %zu bytes but %zu elements encoded with %s take %zu; "
                 "size it with squallEncodedSize",
                 capacity, count, codecName(spec.codec), layout->totalBytes);
  const size_t inputBytes = count * dtypeSize(dtype);  // cannot overflow: the layout fit
  SQUALL_REQUIRE(count == 0 || !overlaps(input, inputBytes, output, layout->totalBytes),
                 Status::kInvalidUsage, subsys,
                 "the input and the encoded output overlap; encode into a separate buffer");
  return Status::kOk;
}

namespace {

// The bytes past which a call streams: a cache's size from sysconf (0 or -1
// where it does not know it: then `fallback`). SQUALL_STREAM_STORES=always /
// never moves every threshold to 0 / infinity. Read once per threshold (a
// cache size can cost cpuid instructions, which trap in a VM).
size_t streamThreshold(int cache, size_t fallback) {
  static const std::string mode = [] {
    std::string m = paramString(Param::kStreamStores);
    if (m != "always" && m != "never" && m != "auto") {
      if (!m.empty())
        SQUALL_WARN(Subsys::kEnv,
                    "SQUALL_STREAM_STORES=%s is not auto, always or never; using auto", m.c_str());
      m = "auto";
    }
    return m;
  }();
  if (mode == "always") return 0;
  if (mode == "never") return SIZE_MAX;
  const long size = sysconf(cache);
  return size > 0 ? static_cast<size_t>(size) : fallback;
}

}  // namespace

Stores storesFor(size_t bytes) {
  static const size_t threshold = streamThreshold(_SC_LEVEL3_CACHE_SIZE, size_t{32} << 20);
  return bytes > threshold ? Stores::kStream : Stores::kCached;
}

Stores residualStoresFor(size_t bytes) {
  static const size_t threshold = streamThreshold(_SC_LEVEL2_CACHE_SIZE, size_t{1} << 20);
  return bytes > threshold ? Stores::kStream : Stores::kCached;
}

Status encodeRaw(const Spec& spec, const void* input, DType dtype, size_t count,
                 ResidualSpan residual, void* output, size_t capacity, EncodeResult* result,
                 Stores stores) {
  SQUALL_TRY(checkEncodeResult(residual, result));
  Layout layout;
  SQUALL_TRY(checkEncodeArgs(spec, input, dtype, count, output, capacity, Subsys::kCodec, &layout));
  uint8_t* payload = beginEncoding(spec, count, layout, output);
  EncodeResult r{layout.totalBytes, true};
  if (count != 0) {
    const CodecKernels& k = activeKernels().codecs[static_cast<int>(spec.codec)];
    const Bf16Residual bf16 = bf16Of(residual);
    r.finite = parallelEncode(k.encode,
                              EncodeJob{input, dtype, count, spec, layout, f32In(residual),
                                        f32Out(residual), payload, stores == Stores::kStream},
                              codecThreads(), bf16.in != nullptr ? &bf16 : nullptr);
  }
  *result = r;
  return Status::kOk;
}

Status encode(const Spec& spec, const void* input, DType dtype, size_t count, Residual* residual,
              void* output, size_t capacity, EncodeResult* result) {
  if (residual != nullptr) {
    SQUALL_REQUIRE(residual->count() == count, Status::kInvalidUsage, Subsys::kCodec,
                   "the residual was created for %zu elements but the input has %zu; use "
                   "one residual per buffer, of the buffer's size",
                   residual->count(), count);
  }
  SQUALL_TRY(encodeRaw(spec, input, dtype, count,
                       residual != nullptr ? residual->span() : ResidualSpan{}, output, capacity,
                       result));
  if (residual != nullptr) residual->commit(result->finite);
  return Status::kOk;
}

Status decode(const void* input, size_t bytes, float* output, size_t count, Stores stores) {
  return decodeInto(input, bytes, output, count, false, stores);
}

Status decodeSum(const uint8_t* const* encodings, size_t n, size_t bytes, float* out, size_t count,
                 int divisor, Stores stores) {
  SQUALL_REQUIRE(encodings != nullptr && n >= 1, Status::kInvalidArgument, Subsys::kCodec,
                 "a sum needs at least one encoding (got %zu, pointer %p)", n,
                 static_cast<const void*>(encodings));
  if (n == 1 && divisor <= 1) return decodeInto(encodings[0], bytes, out, count, false, stores);
  SQUALL_REQUIRE(out != nullptr || count == 0, Status::kInvalidArgument, Subsys::kCodec,
                 "the output pointer is NULL but count is %zu", count);
  Payloads payloads(n);
  Spec spec;
  Layout layout;
  SQUALL_TRY(checkSum(encodings, n, bytes, count, &spec, &layout, payloads.data()));
  for (size_t j = 0; j < n; ++j) {
    SQUALL_REQUIRE(count == 0 || !overlaps(encodings[j], bytes, out, count * sizeof(float)),
                   Status::kInvalidUsage, Subsys::kCodec,
                   "encoding %zu of a sum overlaps the output; decode into a separate buffer", j);
  }
  if (count == 0) return Status::kOk;
  const CodecKernels& k = activeKernels().codecs[static_cast<int>(spec.codec)];
  parallelDecodeSum(k, SumJob{payloads.data(), n, count, spec, layout, divisor}, out,
                    stores == Stores::kStream, codecThreads());
  return Status::kOk;
}

Status encodeSum(const Spec& spec, const uint8_t* const* encodings, size_t n, size_t bytes,
                 size_t count, int divisor, ResidualSpan residual, void* output, size_t capacity,
                 EncodeResult* result, Stores stores) {
  SQUALL_TRY(checkEncodeResult(residual, result));
  Payloads payloads(n);
  Spec inSpec;
  Layout inLayout;
  SQUALL_TRY(checkSum(encodings, n, bytes, count, &inSpec, &inLayout, payloads.data()));
  // One spec in and out: a tile is then whole blocks of both.
  SQUALL_REQUIRE(sameEncoding(spec, inSpec), Status::kInvalidUsage, Subsys::kCodec,
                 "a sum of %s block %u encodings is re-encoded with %s block %u; encodeSum "
                 "re-encodes with the encodings' own spec",
                 codecName(inSpec.codec), inSpec.block, codecName(spec.codec), spec.block);
  SQUALL_REQUIRE(output != nullptr, Status::kInvalidArgument, Subsys::kCodec,
                 "the output pointer is NULL");
  const Layout& layout = inLayout;
  SQUALL_REQUIRE(capacity >= layout.totalBytes, Status::kInvalidArgument, Subsys::kCodec,
                 "the output holds %zu bytes but %zu elements encoded with %s take %zu; "
                 "size it with squallEncodedSize",
                 capacity, count, codecName(spec.codec), layout.totalBytes);
  for (size_t j = 0; j < n; ++j) {
    SQUALL_REQUIRE(!overlaps(encodings[j], bytes, output, layout.totalBytes), Status::kInvalidUsage,
                   Subsys::kCodec,
                   "encoding %zu of a sum overlaps the encoded output; encode into a separate "
                   "buffer",
                   j);
  }
  uint8_t* payload = beginEncoding(spec, count, layout, output);
  EncodeResult r{layout.totalBytes, true};
  if (count != 0) {
    const KernelTable& table = activeKernels();
    const EncodeJob job{nullptr,
                        DType::kF32,
                        count,
                        spec,
                        layout,
                        f32In(residual),
                        f32Out(residual),
                        payload,
                        stores == Stores::kStream};
    const CodecKernels& k = table.codecs[static_cast<int>(spec.codec)];
    const Bf16Residual bf16 = bf16Of(residual);
    r.finite =
        parallelEncodeSum(k, SumJob{payloads.data(), n, count, spec, layout, divisor}, k.encode,
                          job, codecThreads(), bf16.in != nullptr ? &bf16 : nullptr);
  }
  *result = r;
  return Status::kOk;
}

Status decodeAccumulate(const void* input, size_t bytes, float* accumulator, size_t count) {
  return decodeInto(input, bytes, accumulator, count, true);
}

Status inspect(const void* input, size_t bytes, Spec* spec, size_t* count) {
  SQUALL_REQUIRE(input != nullptr && spec != nullptr && count != nullptr, Status::kInvalidArgument,
                 Subsys::kCodec,
                 "squallEncodedInspect needs non-NULL input, spec and count pointers");
  Layout layout;
  return readHeader(input, bytes, spec, count, &layout);
}

Status encodingFinite(const void* input, size_t bytes, bool* finite) {
  SQUALL_REQUIRE(input != nullptr && finite != nullptr, Status::kInvalidArgument, Subsys::kCodec,
                 "encodingFinite needs non-NULL input and result pointers");
  Spec spec;
  size_t count = 0;
  Layout layout;
  SQUALL_TRY(readHeader(input, bytes, &spec, &count, &layout));
  const auto* payload = static_cast<const uint8_t*>(input) + kHeaderBytes;
  bool all = true;
  auto scan = [&](auto word, size_t n, size_t offset, auto isFiniteWord) {
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(&word, payload + offset + i * sizeof(word), sizeof(word));
      all = all && isFiniteWord(word);
    }
  };
  switch (spec.codec) {
    case CodecId::kOnebit:
    case CodecId::kInt2:
    case CodecId::kInt4:
    case CodecId::kInt8:
      scan(float{}, layout.blocks, 0, [](float f) { return isFinite(f); });
      break;
    case CodecId::kNone:
      scan(float{}, count, layout.dataOffset, [](float f) { return isFinite(f); });
      break;
    case CodecId::kFp16:
      scan(uint16_t{}, count, layout.dataOffset,
           [](uint16_t h) { return (h & 0x7c00u) != 0x7c00u; });
      break;
    case CodecId::kBf16:
      scan(uint16_t{}, count, layout.dataOffset,
           [](uint16_t h) { return (h & 0x7f80u) != 0x7f80u; });
      break;
  }
  *finite = all;
  return Status::kOk;
}

const char* implementationName() { return activeKernels().name; }

}  // namespace squall::codec
