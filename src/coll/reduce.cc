#include "src/coll/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/codec/numeric.h"

namespace squall::coll {
namespace {

struct F16 {
  using Storage = uint16_t;
  using Compute = float;
  static float widen(uint16_t v) { return codec::halfToFloat(v); }
  static uint16_t narrow(float v) { return codec::floatToHalf(v); }
};
struct Bf16 {
  using Storage = uint16_t;
  using Compute = float;
  static float widen(uint16_t v) { return codec::bf16ToFloat(v); }
  static uint16_t narrow(float v) { return codec::floatToBf16(v); }
};
template <typename T>
struct Plain {
  using Storage = T;
  using Compute = T;
  static T widen(T v) { return v; }
  static T narrow(T v) { return v; }
};

template <typename F>
void reduceTyped(ReduceOp op, void* accVoid, const void* inVoid, size_t count) {
  using S = typename F::Storage;
  using C = typename F::Compute;
  auto* acc = static_cast<uint8_t*>(accVoid);
  const auto* in = static_cast<const uint8_t*>(inVoid);
  for (size_t i = 0; i < count; ++i) {
    S a, b;
    std::memcpy(&a, acc + i * sizeof(S), sizeof(S));
    std::memcpy(&b, in + i * sizeof(S), sizeof(S));
    const C x = F::widen(a);
    const C y = F::widen(b);
    C r;
    switch (op) {
      case ReduceOp::kMin: r = y < x ? y : x; break;
      case ReduceOp::kMax: r = x < y ? y : x; break;
      default:
        if constexpr (std::is_integral_v<C>) {  // wraps instead of overflowing
          using U = std::make_unsigned_t<C>;
          r = static_cast<C>(static_cast<U>(x) + static_cast<U>(y));
        } else {
          r = x + y;
        }
        break;
    }
    const S s = F::narrow(r);
    std::memcpy(acc + i * sizeof(S), &s, sizeof(S));
  }
}

template <typename F>
void averageTyped(void* bufferVoid, size_t count, int n) {
  using S = typename F::Storage;
  using C = typename F::Compute;
  auto* buffer = static_cast<uint8_t*>(bufferVoid);
  for (size_t i = 0; i < count; ++i) {
    S a;
    std::memcpy(&a, buffer + i * sizeof(S), sizeof(S));
    const S s = F::narrow(static_cast<C>(F::widen(a) / static_cast<C>(n)));
    std::memcpy(buffer + i * sizeof(S), &s, sizeof(S));
  }
}

}  // namespace

void reduceInto(DataType dtype, ReduceOp op, void* acc, const void* in, size_t count) {
  switch (dtype) {
    case DataType::kF32: return reduceTyped<Plain<float>>(op, acc, in, count);
    case DataType::kF64: return reduceTyped<Plain<double>>(op, acc, in, count);
    case DataType::kF16: return reduceTyped<F16>(op, acc, in, count);
    case DataType::kBf16: return reduceTyped<Bf16>(op, acc, in, count);
    case DataType::kI32: return reduceTyped<Plain<int32_t>>(op, acc, in, count);
    case DataType::kI64: return reduceTyped<Plain<int64_t>>(op, acc, in, count);
  }
}

void finishAverage(DataType dtype, void* buffer, size_t count, int n) {
  switch (dtype) {
    case DataType::kF32: return averageTyped<Plain<float>>(buffer, count, n);
    case DataType::kF64: return averageTyped<Plain<double>>(buffer, count, n);
    case DataType::kF16: return averageTyped<F16>(buffer, count, n);
    case DataType::kBf16: return averageTyped<Bf16>(buffer, count, n);
    case DataType::kI32: return averageTyped<Plain<int32_t>>(buffer, count, n);
    case DataType::kI64: return averageTyped<Plain<int64_t>>(buffer, count, n);
  }
}

bool isValidDataType(DataType dtype) {
  return static_cast<unsigned>(dtype) < static_cast<unsigned>(kNumDataTypes);
}

bool isValidReduceOp(ReduceOp op) {
  return static_cast<unsigned>(op) < static_cast<unsigned>(kNumReduceOps);
}

}  // namespace squall::coll
