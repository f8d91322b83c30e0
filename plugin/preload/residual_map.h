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
#include <set>
#include <tuple>
#include <vector>

#include "src/common/status.h"
#include "src/common/types.h"

namespace squall::preload {

// The tensor boundaries of a step, learnt from where its calls begin and
// end: a framework fuses whole tensors into a call, so every call edge is a
// tensor edge, and across steps whose cuts differ they reveal the tensors
// that fusion hides. Every rank sees the same calls, so the same edges.
class TensorEdges {
 public:
  void add(int64_t offset, size_t count) {
    edges_.insert(offset);
    edges_.insert(offset + static_cast<int64_t>(count));
  }
  void clear() { edges_.clear(); }
  size_t size() const { return edges_.size(); }

  // A call cut at the edges learnt so far into runs: each run is either a
  // span of tensors to compress or consecutive tensors each smaller than
  // `minElements`, to send at full precision (what they would get alone).
  struct Run {
    int64_t offset = 0;
    size_t count = 0;
    bool full = false;
  };
  std::vector<Run> runs(int64_t offset, size_t count, size_t minElements) const;

 private:
  std::set<int64_t> edges_;
};

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
  // The edges of the learning window's calls under `proposal` (before adopt).
  void windowEdges(const int64_t proposal[2], TensorEdges* edges) const;

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
  // The keys of the other entries of key's element type whose elements
  // intersect key's, in key order.
  std::vector<ResidualKey> overlapping(const ResidualKey& key) const {
    std::vector<ResidualKey> found;
    for (const auto& [k, at] : index_) {
      if (k.dtype != key.dtype || (k.offset == key.offset && k.count == key.count)) continue;
      const int64_t end = k.offset + static_cast<int64_t>(k.count);
      if (k.offset < key.offset + static_cast<int64_t>(key.count) && key.offset < end)
        found.push_back(k);
    }
    return found;
  }
  // Removes the entry and hands its value over (null when absent).
  std::unique_ptr<Value> take(const ResidualKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    std::unique_ptr<Value> value = std::move(it->second->value);
    erase(key);
    return value;
  }
  // The least recently used entry's key; false when empty.
  bool leastRecent(ResidualKey* key) const {
    if (lru_.empty()) return false;
    *key = lru_.front().key;
    return true;
  }
  bool fits(size_t bytes) const { return bytes <= cap_; }
  // Whether `bytes` more fit without evicting.
  bool roomFor(size_t bytes) const { return used_ + bytes <= cap_; }
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

// Error still owed to the elements of a step, in step coordinates: what the
// residuals of entries that were dropped (their cut changed, or they were
// evicted) held, until the next call that covers those elements takes it.
class OwedError {
 public:
  // The owed error of elements [offset, offset + count), writable (zero
  // where nothing is owed); grows the store to hold them.
  float* span(int64_t offset, size_t count);
  // Marks [offset, offset + count) as holding owed error.
  void markPending(int64_t offset, size_t count);
  // Whether any element of [offset, offset + count) holds owed error.
  bool pending(int64_t offset, size_t count) const;
  // Zeroes [offset, offset + count) and marks it as owing nothing.
  void settle(int64_t offset, size_t count);
  void clear();
  // Elements with owed error.
  int64_t pendingElements() const;

 private:
  std::vector<float> values_;
  std::map<int64_t, int64_t> pending_;  // begin -> end, disjoint, not adjacent
};

// The residuals of one communicator, keyed by where each call lies in its
// step, under one rule that makes error feedback survive a change of cut:
// entries never overlap. A call whose key is held runs with it; a call cut
// differently first drains every entry it overlaps (their owed error goes
// to OwedError, in step coordinates, and the entries go), and its new entry
// is seeded with the owed error of its own elements. Eviction drains too,
// so error is lost only when the step is learnt again. Drain and seed are
// local to each rank; every rank sees the same calls, so every rank drops,
// makes and evicts the same entries.
template <class Value>
class StepResiduals {
 public:
  explicit StepResiduals(size_t capBytes) : map_(capBytes) {}

  struct Outcome {
    Value* value = nullptr;  // null: the state alone exceeds the cap
    bool recut = false;      // the call took over what other entries held
    uint64_t evicted = 0;
  };
  // The entry for `key` (of `bytes`, residualBytes), made when missing.
  // ops.make(std::unique_ptr<Value>*), ops.drain(Value&, float* owed) and
  // ops.seed(Value&, const float* owed) return Status.
  template <class Ops>
  Status acquire(const ResidualKey& key, size_t bytes, Ops& ops, Outcome* out) {
    *out = Outcome{};
    out->value = map_.find(key);
    if (out->value != nullptr) return Status::kOk;
    OwedError& owed = owed_[key.dtype];
    for (const ResidualKey& other : map_.overlapping(key)) {
      SQUALL_TRY(drain(other, ops));
      out->recut = true;
    }
    if (!map_.fits(bytes)) return Status::kOk;
    ResidualKey oldest;
    while (!map_.roomFor(bytes) && map_.leastRecent(&oldest)) {
      SQUALL_TRY(drain(oldest, ops));
      ++out->evicted;
    }
    std::unique_ptr<Value> fresh;
    SQUALL_TRY(ops.make(&fresh));
    if (owed.pending(key.offset, key.count)) {
      SQUALL_TRY(ops.seed(*fresh, owed.span(key.offset, key.count)));
      owed.settle(key.offset, key.count);
      out->recut = true;
    }
    out->value = fresh.get();
    if (!map_.insert(key, std::move(fresh), bytes)) out->value = nullptr;  // fits() said so
    return Status::kOk;
  }

  // Forgets everything, owed error too (the step was learnt again).
  void clear() {
    map_.clear();
    owed_.clear();
  }
  size_t size() const { return map_.size(); }
  size_t usedBytes() const { return map_.usedBytes(); }
  bool fits(size_t bytes) const { return map_.fits(bytes); }
  // Elements of `dtype` whose owed error waits for a call.
  int64_t pendingElements(DataType dtype) const {
    auto it = owed_.find(dtype);
    return it == owed_.end() ? 0 : it->second.pendingElements();
  }

 private:
  template <class Ops>
  Status drain(const ResidualKey& key, Ops& ops) {
    std::unique_ptr<Value> value = map_.take(key);
    if (value == nullptr) return Status::kOk;
    OwedError& owed = owed_[key.dtype];
    SQUALL_TRY(ops.drain(*value, owed.span(key.offset, key.count)));
    owed.markPending(key.offset, key.count);
    return Status::kOk;
  }

  ResidualMap<Value> map_;
  std::map<DataType, OwedError> owed_;
};

// What the compressed allreduce keeps for `count` elements over `nranks`
// ranks: double-buffered fp32 worker and server residuals plus scratch, as an
// estimate from rank-identical facts only.
size_t residualBytes(size_t count, int nranks);

}  // namespace squall::preload
