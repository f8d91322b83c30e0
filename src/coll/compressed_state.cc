#include "src/coll/compressed_state.h"

namespace squall::coll {

Status CompressedState::create(int nranks, size_t count, const codec::Spec& spec,
                               std::unique_ptr<CompressedState>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the compressed-state output pointer is NULL");
  SQUALL_REQUIRE(nranks >= 1, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed allreduce needs at least one rank, not %d", nranks);
  SQUALL_TRY(codec::validateSpec(spec));
  std::unique_ptr<CompressedState> s(new CompressedState());
  s->nranks_ = nranks;
  s->count_ = count;
  s->spec_ = spec;
  s->unit_ = codec::usesBlocks(spec.codec) ? spec.block : 1;
  const size_t group = s->unit_ * static_cast<size_t>(nranks);
  SQUALL_REQUIRE(count <= SIZE_MAX / 8 - group, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed allreduce of %zu elements is too large for this machine", count);
  const size_t padded = (count + group - 1) / group * group;
  s->chunk_ = padded / static_cast<size_t>(nranks);
  SQUALL_TRY(codec::Residual::create(padded, &s->worker_));
  SQUALL_TRY(codec::Residual::create(s->chunk_, &s->server_));
  *out = std::move(s);
  return Status::kOk;
}

void CompressedState::reset() {
  worker_->reset();
  server_->reset();
}

}  // namespace squall::coll
