// Reading and writing the library's saved states (the optimizer state, a
// compressor's residuals): fields copied byte for byte in host order, a
// reader that refuses to move past the end, and the FNV-1a 64 checksum that
// closes every saved state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace squall {

inline uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Writes into a buffer the caller sized beforehand.
class ByteWriter {
 public:
  explicit ByteWriter(uint8_t* p) : p_(p) {}
  template <typename T>
  void put(const T& v) {
    std::memcpy(p_ + at_, &v, sizeof(T));
    at_ += sizeof(T);
  }
  void bytes(const void* src, size_t n) {
    if (n != 0) std::memcpy(p_ + at_, src, n);
    at_ += n;
  }
  uint8_t* here() { return p_ + at_; }
  void skip(size_t n) { at_ += n; }
  size_t at() const { return at_; }

 private:
  uint8_t* p_;
  size_t at_ = 0;
};

// Reads from `n` bytes; a read that would pass the end returns false and
// reads nothing.
class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  bool get(T* v) {
    if (n_ - at_ < sizeof(T)) return false;
    std::memcpy(v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool bytes(void* dst, size_t n) {
    if (n_ - at_ < n) return false;
    if (n != 0) std::memcpy(dst, p_ + at_, n);
    at_ += n;
    return true;
  }
  const uint8_t* here() const { return p_ + at_; }
  size_t left() const { return n_ - at_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

}  // namespace squall
