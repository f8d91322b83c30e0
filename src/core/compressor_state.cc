// Saving and loading a compressor's residuals (format in compressor_state.h).
#include "src/core/compressor_state.h"

#include "src/common/saved_state.h"

namespace squall::core {

namespace {

constexpr SavedFormat kFormat{"SQCMPST1",
                              "compressor state",
                              "squallCompressorSaveState",
                              "squallCompressorStateSize",
                              Subsys::kApi,
                              1,
                              1};
constexpr size_t kChecksumBytes = kSavedChecksumBytes;

// What a state records about the compressor it came from, in file order.
struct Identity {
  uint32_t layout = 0, codec = 0, scale = 0, block = 0;
  int32_t nranks = 0, rank = 0;
  uint64_t count = 0, phase = 0;
  int32_t hosts = 0, ranksPerHost = 1;
  uint64_t workerCount = 0, serverCount = 0;
};

template <typename Visit>
void fields(Identity& id, Visit&& visit) {
  visit(id.layout);
  visit(id.codec);
  visit(id.scale);
  visit(id.block);
  visit(id.nranks);
  visit(id.rank);
  visit(id.count);
  visit(id.phase);
  visit(id.hosts);
  visit(id.ranksPerHost);
  visit(id.workerCount);
  visit(id.serverCount);
}

constexpr size_t kIdentityBytes = 4 * 4 + 4 * 2 + 8 * 2 + 4 * 2 + 8 * 2;
constexpr size_t kPrefixBytes = kSavedPrefixBytes;

Status identityOf(Compressor& c, Identity* id) {
  size_t worker = 0, server = 0;
  SQUALL_TRY(c.residualCounts(&worker, &server));
  CompressorStats stats;
  SQUALL_TRY(c.stats(&stats));
  id->layout = static_cast<uint32_t>(c.layout());  // 0 allreduce, 1 reduce-scatter, 2 all-gather
  id->codec = static_cast<uint32_t>(c.spec().codec);
  id->scale = static_cast<uint32_t>(c.spec().scale);
  id->block = codec::usesBlocks(c.spec().codec) ? c.spec().block : 0;
  id->nranks = c.comm().size();
  id->rank = c.comm().rank();
  id->count = c.count();
  id->phase = c.phase();
  id->hosts = stats.hosts;
  id->ranksPerHost = stats.ranksPerHost;
  id->workerCount = worker;
  id->serverCount = server;
  return Status::kOk;
}

size_t totalBytes(const Identity& id) {
  return kPrefixBytes + kIdentityBytes + (id.workerCount + id.serverCount) * sizeof(float) +
         kChecksumBytes;
}

const char* layoutName(uint32_t layout) {
  return layout == 2 ? "all-gather" : layout == 1 ? "reduce-scatter" : "allreduce";
}

#define CORRUPT(...) SQUALL_FAIL(Status::kCorruptData, Subsys::kApi, __VA_ARGS__)
#define MISMATCH(...) SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi, __VA_ARGS__)

// Why a saved state does not fit this compressor, most telling first.
Status checkFits(const Identity& saved, const Identity& here) {
  if (saved.layout != here.layout)
    return MISMATCH("the compressor state was saved from a %s compressor; this one is for the %s",
                    layoutName(saved.layout), layoutName(here.layout));
  if (saved.nranks != here.nranks || saved.rank != here.rank)
    return MISMATCH(
        "the compressor state is rank %d's of a group of %d; this compressor is rank %d's of %d. "
        "Residuals belong to their rank: load each rank's own state, or reset the compressor "
        "when the group changed",
        saved.rank, saved.nranks, here.rank, here.nranks);
  if (saved.count != here.count || saved.phase != here.phase)
    return MISMATCH(
        "the compressor state is of %llu elements (phase %llu); this compressor's are %llu "
        "(phase %llu): the buffer changed shape; reset the compressor instead",
        static_cast<unsigned long long>(saved.count), static_cast<unsigned long long>(saved.phase),
        static_cast<unsigned long long>(here.count), static_cast<unsigned long long>(here.phase));
  if (saved.codec != here.codec || saved.scale != here.scale || saved.block != here.block)
    return MISMATCH(
        "the compressor state was saved with %s (block %u, scale kind %u); this compressor "
        "runs %s (block %u, scale kind %u): a residual is owed in its own code's blocks; "
        "make the compressor with the saved code, or reset it",
        codec::codecName(static_cast<codec::CodecId>(saved.codec)), saved.block, saved.scale,
        codec::codecName(static_cast<codec::CodecId>(here.codec)), here.block, here.scale);
  if (saved.hosts != here.hosts || saved.ranksPerHost != here.ranksPerHost)
    return MISMATCH(
        "the compressor state was saved on %d host(s) of %d rank(s) (0: flat); this compressor "
        "runs on %d of %d: its residuals cover other slices; reset the compressor",
        saved.hosts, saved.ranksPerHost, here.hosts, here.ranksPerHost);
  if (saved.workerCount != here.workerCount || saved.serverCount != here.serverCount)
    return MISMATCH(
        "the compressor state holds %llu + %llu residual values; this compressor keeps %llu + "
        "%llu (one of them was made without error feedback)",
        static_cast<unsigned long long>(saved.workerCount),
        static_cast<unsigned long long>(saved.serverCount),
        static_cast<unsigned long long>(here.workerCount),
        static_cast<unsigned long long>(here.serverCount));
  return Status::kOk;
}

}  // namespace

Status compressorStateSize(Compressor& compressor, size_t* bytes) {
  Identity id;
  SQUALL_TRY(identityOf(compressor, &id));
  *bytes = totalBytes(id);
  return Status::kOk;
}

Status saveCompressorState(Compressor& compressor, void* buffer, size_t capacity, size_t* written) {
  Identity id;
  SQUALL_TRY(identityOf(compressor, &id));
  const size_t total = totalBytes(id);
  ByteWriter w(nullptr);
  SQUALL_TRY(beginSaved(kFormat, buffer, capacity, total, &w));
  fields(id, [&](auto& v) { w.put(v); });
  uint8_t* worker = w.here();
  w.skip(id.workerCount * sizeof(float));
  uint8_t* server = w.here();
  w.skip(id.serverCount * sizeof(float));
  SQUALL_TRY(compressor.readResiduals(worker, server));
  endSaved(buffer, &w);
  *written = w.at();
  return Status::kOk;
}

Status loadCompressorState(Compressor& compressor, const void* buffer, size_t bytes) {
  Identity here;
  SQUALL_TRY(identityOf(compressor, &here));
  uint32_t version = 0;
  SQUALL_TRY(
      checkSaved(kFormat, buffer, bytes, kPrefixBytes + kIdentityBytes + kChecksumBytes, &version));
  ByteReader r(static_cast<const uint8_t*>(buffer) + kPrefixBytes, bytes - kPrefixBytes);
  Identity saved;
  fields(saved, [&](auto& v) { r.get(&v); });
  const size_t values = (bytes - kPrefixBytes - kIdentityBytes - kChecksumBytes) / sizeof(float);
  if (saved.workerCount > values || saved.serverCount != values - saved.workerCount ||
      (bytes - kPrefixBytes - kIdentityBytes - kChecksumBytes) % sizeof(float) != 0)
    return CORRUPT(
        "the compressor state's residual sizes (%llu + %llu values) do not match its length",
        static_cast<unsigned long long>(saved.workerCount),
        static_cast<unsigned long long>(saved.serverCount));
  SQUALL_TRY(checkFits(saved, here));
  const uint8_t* worker = r.here();
  return compressor.writeResiduals(worker, worker + saved.workerCount * sizeof(float));
}

}  // namespace squall::core
