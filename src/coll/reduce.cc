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

// One loop per (type, op), so that the compiler sees a branch-free body it
// can vectorise; out may alias a (the in-place form).
template <typename F, ReduceOp Op>
void combineTyped(void* outVoid, const void* aVoid, const void* bVoid, size_t count) {
  using S = typename F::Storage;
  using C = typename F::Compute;
  auto* out = static_cast<uint8_t*>(outVoid);
  const auto* pa = static_cast<const uint8_t*>(aVoid);
  const auto* pb = static_cast<const uint8_t*>(bVoid);
  for (size_t i = 0; i < count; ++i) {
    S a, b;
    std::memcpy(&a, pa + i * sizeof(S), sizeof(S));
    std::memcpy(&b, pb + i * sizeof(S), sizeof(S));
    const C x = F::widen(a);
    const C y = F::widen(b);
    C r;
    if constexpr (Op == ReduceOp::kMin) {
      r = y < x ? y : x;
    } else if constexpr (Op == ReduceOp::kMax) {
      r = x < y ? y : x;
    } else if constexpr (std::is_integral_v<C>) {  // wraps instead of overflowing
      using U = std::make_unsigned_t<C>;
      r = static_cast<C>(static_cast<U>(x) + static_cast<U>(y));
    } else {
      r = x + y;
    }
    const S s = F::narrow(r);
    std::memcpy(out + i * sizeof(S), &s, sizeof(S));
  }
}

template <typename F>
void combineOp(ReduceOp op, void* out, const void* a, const void* b, size_t count) {
  switch (op) {
    case ReduceOp::kMin: return combineTyped<F, ReduceOp::kMin>(out, a, b, count);
    case ReduceOp::kMax: return combineTyped<F, ReduceOp::kMax>(out, a, b, count);
    default: return combineTyped<F, ReduceOp::kSum>(out, a, b, count);  // avg sums too
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

void combine(DataType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t count) {
  switch (dtype) {
    case DataType::kF32: return combineOp<Plain<float>>(op, out, a, b, count);
    case DataType::kF64: return combineOp<Plain<double>>(op, out, a, b, count);
    case DataType::kF16: return combineOp<F16>(op, out, a, b, count);
    case DataType::kBf16: return combineOp<Bf16>(op, out, a, b, count);
    case DataType::kI32: return combineOp<Plain<int32_t>>(op, out, a, b, count);
    case DataType::kI64: return combineOp<Plain<int64_t>>(op, out, a, b, count);
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
