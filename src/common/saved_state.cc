// The saved states' shared frame (saved_state.h).
#include "src/common/saved_state.h"

#include <cstring>

namespace squall {
namespace {

constexpr uint32_t kByteOrder = 0x01020304u;

}  // namespace

Status beginSaved(const SavedFormat& format, void* buffer, size_t capacity, size_t total,
                  ByteWriter* w) {
  SQUALL_REQUIRE(buffer != nullptr, Status::kInvalidArgument, format.subsys,
                 "the state buffer is NULL; allocate %s bytes", format.sizer);
  SQUALL_REQUIRE(capacity >= total, Status::kInvalidArgument, format.subsys,
                 "the state buffer holds %zu bytes but the %s needs %zu; ask %s", capacity,
                 format.what, total, format.sizer);
  *w = ByteWriter(static_cast<uint8_t*>(buffer));
  w->bytes(format.magic, 8);
  w->put(format.version);
  w->put(kByteOrder);
  w->put(static_cast<uint64_t>(total));
  return Status::kOk;
}

void endSaved(const void* start, ByteWriter* w) {
  w->put(fnv1a64(static_cast<const uint8_t*>(start), w->at()));
}

Status checkSaved(const SavedFormat& format, const void* data, size_t bytes, size_t minBytes,
                  uint32_t* version) {
#define CORRUPT(...) SQUALL_FAIL(Status::kCorruptData, format.subsys, __VA_ARGS__)
  SQUALL_REQUIRE(data != nullptr, Status::kInvalidArgument, format.subsys,
                 "the state buffer is NULL");
  const auto* p = static_cast<const uint8_t*>(data);
  if (minBytes < kSavedPrefixBytes + kSavedChecksumBytes)
    minBytes = kSavedPrefixBytes + kSavedChecksumBytes;
  if (bytes < minBytes)
    return CORRUPT(
        "the %s is %zu bytes, shorter than any valid one (%zu); it is truncated or not a "
        "state saved by %s",
        format.what, bytes, minBytes, format.saver);
  if (std::memcmp(p, format.magic, 8) != 0)
    return CORRUPT("the buffer does not start with the %s magic; it is not a state saved by %s",
                   format.what, format.saver);
  ByteReader r(p + 8, bytes - 8);
  uint32_t order = 0;
  uint64_t total = 0;
  r.get(version);
  r.get(&order);
  r.get(&total);
  if (order != kByteOrder)
    return CORRUPT("the %s was saved on a machine of the other byte order", format.what);
  if (*version < format.firstVersion || *version > format.version)
    return CORRUPT("the %s has format version %u; this library reads versions %u to %u",
                   format.what, *version, format.firstVersion, format.version);
  if (total != bytes)
    return CORRUPT(
        "the %s says it is %llu bytes but %zu were given; it is truncated or has trailing data",
        format.what, static_cast<unsigned long long>(total), bytes);
  uint64_t stored = 0;
  std::memcpy(&stored, p + bytes - kSavedChecksumBytes, sizeof(stored));
  if (stored != fnv1a64(p, bytes - kSavedChecksumBytes))
    return CORRUPT("the %s's checksum does not match its contents; it is corrupt", format.what);
  return Status::kOk;
#undef CORRUPT
}

}  // namespace squall
