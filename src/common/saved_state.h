// The frame every saved state of the library shares (the optimizer state,
// a compressor's residuals), so a damaged or foreign one is told apart the
// same way everywhere:
//   offset  0  char[8]  magic, naming the kind of state and its family
//           8  u32      format version
//          12  u32      byte-order mark 0x01020304 (host order: a state from
//                       a machine of the other endianness is refused)
//          16  u64      total length in bytes, checksum included
//          24  ...      the state's own fields
//     end - 8  u64      FNV-1a 64 of every byte before it
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/common/byte_io.h"
#include "src/common/status.h"

namespace squall {

struct SavedFormat {
  const char* magic;  // 8 characters, no terminator needed
  const char* what;   // for messages: "optimizer state"
  const char* saver;  // the function that writes it: "squallOptimizerSaveState"
  const char* sizer;  // the one that says how large: "squallOptimizerStateSize"
  Subsys subsys;
  uint32_t firstVersion;  // the oldest version this library reads
  uint32_t version;       // the one it writes
};

constexpr size_t kSavedPrefixBytes = 8 + 4 + 4 + 8;
constexpr size_t kSavedChecksumBytes = 8;

// Checks that `buffer` holds `capacity` >= `total` bytes and writes the
// prefix there through *w (made on `buffer`).
Status beginSaved(const SavedFormat& format, void* buffer, size_t capacity, size_t total,
                  ByteWriter* w);
// The checksum of everything written so far (from `start`, w's buffer).
void endSaved(const void* start, ByteWriter* w);
// Magic, byte order, version, length and checksum of `bytes` bytes, which
// must be at least `minBytes` (kCorruptData naming what is wrong); the
// version read goes to *version.
Status checkSaved(const SavedFormat& format, const void* data, size_t bytes, size_t minBytes,
                  uint32_t* version);

}  // namespace squall
