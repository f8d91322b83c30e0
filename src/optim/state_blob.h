// The optimizer state blob: a versioned, self-describing byte string.
//
// Layout (host byte order; the byte-order mark rejects a blob from a machine
// of the other endianness):
//   offset  0  char[8]  magic "SQOPTST1"
//           8  u32      format version (kBlobVersion)
//          12  u32      byte-order mark 0x01020304
//          16  u64      total length of the blob in bytes, checksum included
//          24  header   the fields of BlobHeader, in declaration order, each
//                       4 or 8 bytes as declared (kHeaderBytes in all)
//              u32      number of sections (at most kMaxSections)
//              sections, each: char[16] name (NUL-padded), u64 element count,
//                       then that many fp32 values
//     end - 8  u64      FNV-1a 64 of every byte before it
// Parsing checks every length against the bytes actually present before it
// reads them, so a truncated or corrupted blob is rejected (kCorruptData)
// without reading out of bounds. What the sections mean, and whether they
// fit the optimizer, is the optimizer's business (optimizer.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace squall::optim {

// Version 2 added the adaptive warmup's fields (the last five of
// BlobHeader) and its "v_snap" section; version 1 blobs still load, with
// those fields zero (no snapshot: the next window starts the measurement).
constexpr uint32_t kBlobVersion = 2;
constexpr size_t kMaxSections = 16;
constexpr size_t kSectionNameBytes = 16;

struct BlobHeader {
  uint64_t count = 0;
  int32_t nranks = 1;
  int32_t rank = 0;
  int32_t mode = 0;
  int32_t phase = 0;
  int64_t step = 0;
  int64_t adamSteps = 0;  // Adam updates applied (bias correction)
  int64_t warmupSteps = 0;
  uint64_t skippedSteps = 0;
  uint64_t bytesSent = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
  int32_t slowmoTau = 0;
  float slowmoAlpha = 0, slowmoBeta = 0;
  int32_t slowmoCompressed = 0;
  uint32_t codec = 0, scale = 0, block = 0;
  // Version 2.
  int64_t frozenAt = 0;       // the step after which the variance froze (0: not yet)
  int64_t snapAdamSteps = 0;  // the Adam updates behind "v_snap" (0: none)
  int64_t freezeWindow = 0;
  double freezeThreshold = 0;
  double varianceChange = -1;
  uint32_t version = kBlobVersion;  // parsed from the blob; not a header field
};

struct SectionView {
  const char* name;
  const float* data;
  size_t count;
};

struct Section {
  std::string name;
  std::vector<float> data;
};

struct ParsedBlob {
  BlobHeader header;
  std::vector<Section> sections;
  // The section called `name`, or null.
  const Section* find(const char* name) const;
};

size_t blobSize(const std::vector<SectionView>& sections);
Status writeBlob(const BlobHeader& header, const std::vector<SectionView>& sections, void* out,
                 size_t capacity, size_t* written);
Status parseBlob(const void* data, size_t bytes, ParsedBlob* out);

}  // namespace squall::optim
