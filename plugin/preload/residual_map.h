// Which error-feedback residual belongs to which call.
//
// Error feedback carries what the codec did not send of a gradient into the
// next step's copy of the same gradient, so the interposer must find "the same
// gradient" again from the calls alone. A training step reduces the same
// gradients in the same order every step; frameworks may split them into
// calls differently (Horovod fuses whatever is ready within a cycle), but the
// elements reduced by the step, in order, stay the same. So a call is placed at
// its element offset within the step, and its residual is keyed by
// (element type, offset, count) in its communicator. A call whose key was seen
// before covers exactly the same elements as then and gets that residual; a
// call split differently gets a fresh (zero) residual, never another
// gradient's.
//
// The step length (elements per step) is given (SQUALL_PRELOAD_STEP_ELEMENTS)
// or learnt from the first calls of the communicator, which run at full
// precision: the step is the shortest span of consecutive calls that, repeated,
// no call of the window crosses (a framework never splits one call across two
// steps). It is computed from the counts alone, so every rank finds the same
// one without talking. A call that later crosses the end of the step proves the
// length wrong: the communicator's residuals are dropped and the step is learnt
// again. Counts cannot tell a model of identical blocks, each reduced in its own
// call, from a model of one block: set SQUALL_PRELOAD_STEP_ELEMENTS for those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "src/common/types.h"

namespace squall::preload {

class StepTracker {
 public:
  // stepElements > 0: the step is known; otherwise learnt from learnCalls calls.
  StepTracker(int64_t stepElements, int64_t learnCalls);

  struct Placement {
    bool known = false;    // false: run the call at full precision
    bool agree = false;    // the learning window closed with this call: adopt proposal()
    bool relearn = false;  // the call crossed the step's end: drop the residuals
    int64_t offset = 0;    // element offset within the step, when known
  };
  // Places the next eligible call.
  Placement place(size_t count);

  // The learnt step: {elements per step (0: none found), offset of the next call}.
  void proposal(int64_t out[2]) const;
  void adopt(const int64_t in[2]);

  int64_t stepElements() const { return step_; }
  uint64_t relearns() const { return relearns_; }

 private:
  int64_t step_ = 0;
  int64_t offset_ = 0;
  int64_t learnCalls_;
  bool learning_;
  std::vector<size_t> window_;  // counts of the learning window
  uint64_t relearns_ = 0;
};

struct ResidualKey {
  DataType dtype;
  int64_t offset;
  size_t count;
  bool operator<(const ResidualKey& o) const {
    return std::tie(dtype, offset, count) < std::tie(o.dtype, o.offset, o.count);
  }
};

// The residuals of one communicator, least recently used first out beyond a
// byte cap. Every rank of the communicator sees the same calls in the same
// order, so every rank evicts the same entries.
template <class Value>
class ResidualMap {
 public:
  explicit ResidualMap(size_t capBytes) : cap_(capBytes) {}

  // The entry for `key`, or null.
  Value* find(const ResidualKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.end(), lru_, it->second);  // most recently used last
    return it->second->value.get();
  }
  // Inserts `value` (of `bytes`), evicting the least recently used entries
  // until it fits. False (nothing inserted) when `bytes` alone exceeds the cap.
  [[nodiscard]] bool insert(const ResidualKey& key, std::unique_ptr<Value> value, size_t bytes) {
    if (bytes > cap_) return false;
    erase(key);
    while (used_ + bytes > cap_ && !lru_.empty()) {
      ++evictions_;
      erase(lru_.front().key);
    }
    lru_.push_back(Entry{key, std::move(value), bytes});
    index_[key] = std::prev(lru_.end());
    used_ += bytes;
    return true;
  }
  void clear() {
    index_.clear();
    lru_.clear();
    used_ = 0;
  }
  bool fits(size_t bytes) const { return bytes <= cap_; }
  size_t size() const { return index_.size(); }
  size_t usedBytes() const { return used_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    ResidualKey key;
    std::unique_ptr<Value> value;
    size_t bytes;
  };
  void erase(const ResidualKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    used_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  size_t cap_;
  size_t used_ = 0;
  uint64_t evictions_ = 0;
  std::list<Entry> lru_;
  std::map<ResidualKey, typename std::list<Entry>::iterator> index_;
};

// What the compressed allreduce keeps for `count` elements over `nranks`
// ranks: double-buffered fp32 worker and server residuals plus scratch, as an
// estimate from rank-identical facts only.
size_t residualBytes(size_t count, int nranks);

}  // namespace squall::preload
