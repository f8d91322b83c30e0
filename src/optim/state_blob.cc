// Writing and parsing the optimizer state blob (format in state_blob.h).
//
// The writer serialises the header field by field and the sections in order,
// then appends an FNV-1a 64 checksum. The parser walks the same layout with a
// cursor that refuses to move past the end, checks the magic, version,
// byte-order mark, total length and checksum first, then every section
// length against what is left; only a fully valid blob is returned.
#include "src/optim/state_blob.h"

#include <cstring>

#include "src/common/saved_state.h"

namespace squall::optim {
namespace {

constexpr SavedFormat kFormat{"SQOPTST1",
                              "optimizer state",
                              "squallOptimizerSaveState",
                              "squallOptimizerStateSize",
                              Subsys::kOptim,
                              1,
                              kBlobVersion};
constexpr size_t kPrefixBytes = kSavedPrefixBytes;
constexpr size_t kHeaderBytesV1 = 8 + 4 * 4 + 8 * 5 + 4 * 5 + 4 + 4 * 2 + 4 + 4 * 3;
constexpr size_t kHeaderBytes = kHeaderBytesV1 + size_t{8} * 5;
constexpr size_t kSectionHeadBytes = kSectionNameBytes + 8;
constexpr size_t kChecksumBytes = kSavedChecksumBytes;

using Writer = ByteWriter;
using Reader = ByteReader;

template <typename Visit>
void fields(BlobHeader& h, Visit&& visit) {
  visit(h.count);
  visit(h.nranks);
  visit(h.rank);
  visit(h.mode);
  visit(h.phase);
  visit(h.step);
  visit(h.adamSteps);
  visit(h.warmupSteps);
  visit(h.skippedSteps);
  visit(h.bytesSent);
  visit(h.lr);
  visit(h.beta1);
  visit(h.beta2);
  visit(h.eps);
  visit(h.weightDecay);
  visit(h.slowmoTau);
  visit(h.slowmoAlpha);
  visit(h.slowmoBeta);
  visit(h.slowmoCompressed);
  visit(h.codec);
  visit(h.scale);
  visit(h.block);
}

template <typename Visit>
void fieldsV2(BlobHeader& h, Visit&& visit) {
  visit(h.frozenAt);
  visit(h.snapAdamSteps);
  visit(h.freezeWindow);
  visit(h.freezeThreshold);
  visit(h.varianceChange);
}

#define CORRUPT(...) SQUALL_FAIL(Status::kCorruptData, Subsys::kOptim, __VA_ARGS__)

}  // namespace

const Section* ParsedBlob::find(const char* name) const {
  for (const Section& s : sections)
    if (s.name == name) return &s;
  return nullptr;
}

size_t blobSize(const std::vector<SectionView>& sections) {
  size_t total = kPrefixBytes + kHeaderBytes + 4 + kChecksumBytes;
  for (const SectionView& s : sections) total += kSectionHeadBytes + s.count * sizeof(float);
  return total;
}

Status writeBlob(const BlobHeader& header, const std::vector<SectionView>& sections, void* out,
                 size_t capacity, size_t* written) {
  const size_t total = blobSize(sections);
  SQUALL_REQUIRE(sections.size() <= kMaxSections, Status::kInternal, Subsys::kOptim,
                 "%zu state sections exceed the format's %zu", sections.size(), kMaxSections);
  Writer w(nullptr);
  SQUALL_TRY(beginSaved(kFormat, out, capacity, total, &w));
  BlobHeader h = header;
  fields(h, [&](auto& v) { w.put(v); });
  fieldsV2(h, [&](auto& v) { w.put(v); });
  w.put(static_cast<uint32_t>(sections.size()));
  for (const SectionView& s : sections) {
    char name[kSectionNameBytes] = {};
    std::strncpy(name, s.name, kSectionNameBytes - 1);
    w.bytes(name, sizeof(name));
    w.put(static_cast<uint64_t>(s.count));
    w.bytes(s.data, s.count * sizeof(float));
  }
  endSaved(out, &w);
  *written = w.at();
  return Status::kOk;
}

Status parseBlob(const void* data, size_t bytes, ParsedBlob* out) {
  uint32_t version = 0;
  SQUALL_TRY(checkSaved(kFormat, data, bytes, kPrefixBytes + kHeaderBytesV1 + 4 + kChecksumBytes,
                        &version));
  const auto* p = static_cast<const uint8_t*>(data);
  Reader body(p + kPrefixBytes, bytes - kPrefixBytes - kChecksumBytes);
  ParsedBlob blob;
  bool ok = true;
  fields(blob.header, [&](auto& v) { ok = body.get(&v) && ok; });
  if (version >= 2) fieldsV2(blob.header, [&](auto& v) { ok = body.get(&v) && ok; });
  blob.header.version = version;
  uint32_t nsections = 0;
  ok = body.get(&nsections) && ok;
  if (!ok) return CORRUPT("the optimizer state header is truncated");
  if (nsections > kMaxSections)
    return CORRUPT("the optimizer state claims %u sections (at most %zu)", nsections, kMaxSections);
  for (uint32_t i = 0; i < nsections; ++i) {
    char name[kSectionNameBytes + 1] = {};
    uint64_t count = 0;
    if (!body.bytes(name, kSectionNameBytes) || !body.get(&count))
      return CORRUPT("the optimizer state is truncated in the head of section %u", i);
    if (name[kSectionNameBytes - 1] != '\0' || name[0] == '\0')
      return CORRUPT("section %u of the optimizer state has an invalid name", i);
    if (count > body.left() / sizeof(float))
      return CORRUPT(
          "section '%s' of the optimizer state claims %llu values but only %zu bytes "
          "remain",
          name, static_cast<unsigned long long>(count), body.left());
    if (blob.find(name) != nullptr)
      return CORRUPT("section '%s' appears twice in the optimizer state", name);
    Section s;
    s.name = name;
    s.data.resize(static_cast<size_t>(count));
    body.bytes(s.data.data(), s.data.size() * sizeof(float));
    blob.sections.push_back(std::move(s));
  }
  if (body.left() != 0)
    return CORRUPT("the optimizer state has %zu unexplained bytes after its sections", body.left());
  *out = std::move(blob);
  return Status::kOk;
}

}  // namespace squall::optim
