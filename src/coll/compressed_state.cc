#include "src/coll/compressed_state.h"

#include <algorithm>
#include <string>

#include "src/common/log.h"
#include "src/common/params.h"

namespace squall::coll {

codec::ResidualStore residualStoreParam() {
  const std::string precision = paramString(Param::kResidualPrecision);
  if (precision == "bf16") return codec::ResidualStore::kBf16;
  if (precision != "fp32") {
    SQUALL_WARN(Subsys::kEnv, "SQUALL_RESIDUAL_PRECISION=%s is not fp32 or bf16; using fp32",
                precision.c_str());
  }
  return codec::ResidualStore::kF32;
}

Status CompressedState::create(int nranks, size_t count, const codec::Spec& spec,
                               std::unique_ptr<CompressedState>* out, size_t phase,
                               Feedback feedback, codec::ResidualStore store) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the compressed-state output pointer is NULL");
  SQUALL_REQUIRE(nranks >= 1, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed allreduce needs at least one rank, not %d", nranks);
  SQUALL_TRY(codec::validateSpec(spec));
  std::unique_ptr<CompressedState> s(new CompressedState());
  s->nranks_ = nranks;
  s->count_ = count;
  s->spec_ = s->gatherSpec_ = spec;
  s->unit_ = codec::usesBlocks(spec.codec) ? spec.block : 1;
  SQUALL_REQUIRE(phase < s->unit_, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed buffer's phase is its position within a codec block, below %zu, "
                 "not %zu",
                 s->unit_, phase);
  s->phase_ = phase;
  const size_t group = s->unit_ * static_cast<size_t>(nranks);
  SQUALL_REQUIRE(count <= SIZE_MAX / 8 - 2 * group, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed allreduce of %zu elements is too large for this machine", count);
  const size_t padded = (phase + count + group - 1) / group * group;
  s->chunk_ = padded / static_cast<size_t>(nranks);
  if (feedback == Feedback::kKept) {
    SQUALL_TRY(codec::Residual::create(padded, &s->worker_, store));
    SQUALL_TRY(codec::Residual::create(s->chunk_, &s->server_, store));
  }
  *out = std::move(s);
  return Status::kOk;
}

Status CompressedState::createReduceScatter(int nranks, size_t recvcount, const codec::Spec& spec,
                                            std::unique_ptr<CompressedState>* out,
                                            Feedback feedback, codec::ResidualStore store) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the compressed-state output pointer is NULL");
  SQUALL_REQUIRE(nranks >= 1, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed reduce-scatter needs at least one rank, not %d", nranks);
  SQUALL_TRY(codec::validateSpec(spec));
  const auto n = static_cast<size_t>(nranks);
  SQUALL_REQUIRE(recvcount <= (SIZE_MAX / 8) / n, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed reduce-scatter of %d x %zu elements is too large for this machine",
                 nranks, recvcount);
  std::unique_ptr<CompressedState> s(new CompressedState());
  s->nranks_ = nranks;
  s->count_ = recvcount * n;
  s->chunk_ = recvcount;
  s->spec_ = s->gatherSpec_ = spec;
  s->unit_ = codec::usesBlocks(spec.codec) ? spec.block : 1;
  s->reduceScatter_ = true;
  if (feedback == Feedback::kKept) {
    SQUALL_TRY(codec::Residual::create(s->count_, &s->worker_, store));
  }
  *out = std::move(s);
  return Status::kOk;
}

Status CompressedState::createHierarchical(int hosts, int local, int localIndex, size_t count,
                                           const codec::Spec& spec,
                                           std::unique_ptr<CompressedState>* out, Feedback feedback,
                                           codec::ResidualStore store) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the compressed-state output pointer is NULL");
  SQUALL_REQUIRE(hosts >= 2 && local >= 2 && localIndex >= 0 && localIndex < local,
                 Status::kInvalidArgument, Subsys::kColl,
                 "a hierarchical compressed allreduce needs at least 2 hosts of at least 2 ranks "
                 "(local index %d of %d on %d hosts)",
                 localIndex, local, hosts);
  SQUALL_TRY(codec::validateSpec(spec));
  std::unique_ptr<CompressedState> s(new CompressedState());
  s->nranks_ = hosts * local;
  s->count_ = count;
  s->spec_ = s->gatherSpec_ = spec;
  s->unit_ = codec::usesBlocks(spec.codec) ? spec.block : 1;
  s->local_ = local;
  s->localIndex_ = localIndex;
  // Slices are whole groups of H codec units, so every cross chunk is whole
  // blocks; the first (units mod L) slices take one group more.
  const size_t group = s->unit_ * static_cast<size_t>(hosts);
  SQUALL_REQUIRE(count <= SIZE_MAX / 8 - group, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed allreduce of %zu elements is too large for this machine", count);
  const size_t groups = (count + group - 1) / group;
  const auto ll = static_cast<size_t>(local);
  s->slices_.resize(ll + 1);
  for (size_t l = 0; l <= ll; ++l) {
    const size_t begin = l * (groups / ll) + std::min(l, groups % ll);
    s->slices_[l] = std::min(begin * group, count);
  }
  SQUALL_TRY(create(hosts, s->sliceCount(localIndex), spec, &s->cross_, 0, feedback, store));
  *out = std::move(s);
  return Status::kOk;
}

Status CompressedState::setGatherSpec(const codec::Spec& spec) {
  SQUALL_TRY(codec::validateSpec(spec));
  SQUALL_REQUIRE(!reduceScatter_, Status::kInvalidUsage, Subsys::kColl,
                 "a compressed reduce-scatter has no all-gather to choose a code for");
  SQUALL_REQUIRE(spec.codec != codec::CodecId::kNone, Status::kInvalidArgument, Subsys::kColl,
                 "the all-gather's code must be a compressed one; leave it unset for the "
                 "allreduce's own");
  gatherSpec_ = spec;
  if (cross_ != nullptr) return cross_->setGatherSpec(spec);
  return Status::kOk;
}

void CompressedState::reset() {
  if (cross_ != nullptr) {
    cross_->reset();
    return;
  }
  if (worker_ != nullptr) worker_->reset();
  if (server_ != nullptr) server_->reset();
}

void CompressedState::commit(bool finite, bool serverUsed) {
  if (worker_ == nullptr) return;
  worker_->commit(finite);
  if (serverUsed && server_ != nullptr) server_->commit(finite);
}

}  // namespace squall::coll
