// A view of a transport as a smaller group: group rank g is global rank
// ranks[g]. An algorithm written for "the communicator" runs unchanged on a
// subgroup through it (the hierarchical allreduce runs the two-phase
// compressed allreduce among the ranks of one local index this way). Tags
// pass through unchanged: the subgroup's messages use the operation's
// sequence number, and pairs of ranks that talk in the subgroup talk in no
// other part of the operation on the same steps (the caller's business).
// Requests keep global peers, so timeouts and failures name global ranks.
#pragma once

#include <vector>

#include "src/transport/transport.h"

namespace squall::coll {

class GroupTransport final : public transport::Transport {
 public:
  // `ranks` holds the global ranks of the group in group order, this
  // process's among them.
  GroupTransport(transport::Transport* base, std::vector<int> ranks)
      : base_(base), ranks_(std::move(ranks)) {
    for (size_t g = 0; g < ranks_.size(); ++g)
      if (ranks_[g] == base->rank()) rank_ = static_cast<int>(g);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const char* name() const override { return base_->name(); }
  Status send(int peer, const transport::Tag& tag, const void* data, size_t bytes,
              transport::RequestPtr* request) override {
    return base_->send(global(peer), tag, data, bytes, request);
  }
  Status recv(int peer, const transport::Tag& tag, void* data, size_t bytes,
              transport::RequestPtr* request) override {
    return base_->recv(global(peer), tag, data, bytes, request);
  }
  Status watch(int peer, const transport::Tag& tag, void* data, size_t bytes,
               transport::RequestPtr* request) override {
    return base_->watch(global(peer), tag, data, bytes, request);
  }
  Status progress() override { return base_->progress(); }
  Status waitForActivity(transport::Deadline until) override {
    return base_->waitForActivity(until);
  }
  transport::Transport* base() const { return base_; }

 private:
  int global(int peer) const { return ranks_[static_cast<size_t>(peer)]; }
  transport::Transport* base_;
  std::vector<int> ranks_;
  int rank_ = 0;
};

}  // namespace squall::coll
