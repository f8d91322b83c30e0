#include "plugin/preload/residual_map.h"

#include <algorithm>
#include <iterator>
#include <numeric>

namespace squall::preload {

StepTracker::StepTracker(int64_t stepElements, int64_t learnCalls)
    : step_(stepElements),
      learnCalls_(std::max<int64_t>(2, learnCalls)),
      learning_(stepElements <= 0) {}

StepTracker::Placement StepTracker::place(size_t count) {
  Placement p;
  if (learning_) {
    window_.push_back(count);
    p.agree = static_cast<int64_t>(window_.size()) >= learnCalls_;
    return p;
  }
  const auto n = static_cast<int64_t>(count);
  if (step_ <= 0 || offset_ + n > step_) {
    // The sequence does not fit the step (the model or the framework changed
    // what it reduces): forget the placements and learn again.
    p.relearn = true;
    ++relearns_;
    offset_ = 0;
    window_.clear();
    learning_ = true;
    window_.push_back(count);
    return p;
  }
  p.known = true;
  p.offset = offset_;
  offset_ = offset_ + n == step_ ? 0 : offset_ + n;
  return p;
}

void StepTracker::proposal(int64_t out[2]) const {
  out[0] = out[1] = 0;
  const size_t n = window_.size();
  if (n < 2) return;
  std::vector<int64_t> start(n + 1, 0);  // element offset of call i since the window began
  int64_t largest = 0;
  for (size_t i = 0; i < n; ++i) {
    start[i + 1] = start[i] + static_cast<int64_t>(window_[i]);
    largest = std::max(largest, static_cast<int64_t>(window_[i]));
  }
  // True when no call of the window crosses a multiple of `length` counted
  // from `origin`: a framework never splits one call across two steps.
  auto fits = [&](int64_t length, int64_t origin) {
    if (length < largest) return false;
    for (size_t i = 0; i < n; ++i) {
      const int64_t at = ((start[i] - origin) % length + length) % length;
      if (at + static_cast<int64_t>(window_[i]) > length) return false;
    }
    return true;
  };
  int64_t step = 0, phase = 0;
  {
    // The shortest span of consecutive calls, repeated from its first call,
    // that no call of the window crosses.
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = i + 1; j <= n; ++j) {
        const int64_t length = start[j] - start[i];
        if (length < largest || (step != 0 && length >= step)) continue;
        if (2 * length > start[n] - start[i]) break;  // seen at least twice
        if (fits(length, start[i])) {
          step = length;
          phase = start[i];
        }
      }
    }
  }
  if (step <= 0) return;
  out[0] = step;
  out[1] = ((start[n] - phase) % step + step) % step;
}

void StepTracker::windowEdges(const int64_t proposal[2], TensorEdges* edges) const {
  const int64_t step = proposal[0];
  if (step <= 0) return;
  // The window's last call ends where the next one begins; walk back.
  int64_t end = proposal[1] == 0 ? step : proposal[1];
  for (size_t i = window_.size(); i-- > 0;) {
    const auto n = static_cast<int64_t>(window_[i]);
    const int64_t begin = end - n;
    if (begin < 0) return;  // cannot happen: no call of the window crosses the step
    edges->add(begin, window_[i]);
    end = begin == 0 ? step : begin;
  }
}

void StepTracker::adopt(const int64_t in[2]) {
  window_.clear();
  learning_ = false;
  step_ = in[0];
  offset_ = in[0] > 0 ? in[1] : 0;
  // No step found: place nothing (calls run at full precision) and learn again.
  if (step_ <= 0) learning_ = true;
}

std::vector<TensorEdges::Run> TensorEdges::runs(int64_t offset, size_t count,
                                                size_t minElements) const {
  std::vector<Run> out;
  const int64_t end = offset + static_cast<int64_t>(count);
  int64_t begin = offset;
  auto next = edges_.upper_bound(offset);
  while (begin < end) {
    const int64_t stop = next != edges_.end() && *next < end ? *next++ : end;
    const auto length = static_cast<size_t>(stop - begin);
    const bool full = length < minElements;
    if (!out.empty() && out.back().full == full) {
      out.back().count += length;
    } else {
      out.push_back(Run{begin, length, full});
    }
    begin = stop;
  }
  return out;
}

float* OwedError::span(int64_t offset, size_t count) {
  const size_t end = static_cast<size_t>(offset) + count;
  if (values_.size() < end) values_.resize(end, 0.0f);
  return values_.data() + offset;
}

void OwedError::markPending(int64_t offset, size_t count) {
  if (count == 0) return;
  int64_t begin = offset, end = offset + static_cast<int64_t>(count);
  // Merge with every interval that touches [begin, end).
  auto it = pending_.upper_bound(begin);
  if (it != pending_.begin() && std::prev(it)->second >= begin) --it;
  while (it != pending_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = pending_.erase(it);
  }
  pending_[begin] = end;
}

bool OwedError::pending(int64_t offset, size_t count) const {
  const int64_t end = offset + static_cast<int64_t>(count);
  auto it = pending_.upper_bound(offset);
  if (it != pending_.begin() && std::prev(it)->second > offset) return true;
  return it != pending_.end() && it->first < end;
}

void OwedError::settle(int64_t offset, size_t count) {
  const int64_t end = offset + static_cast<int64_t>(count);
  if (static_cast<size_t>(offset) < values_.size())
    std::fill(values_.begin() + offset,
              values_.begin() + std::min(static_cast<size_t>(end), values_.size()), 0.0f);
  auto it = pending_.upper_bound(offset);
  if (it != pending_.begin()) --it;
  while (it != pending_.end() && it->first < end) {
    const int64_t b = it->first, e = it->second;
    if (e <= offset) {
      ++it;
      continue;
    }
    it = pending_.erase(it);
    if (b < offset) pending_[b] = offset;
    if (e > end) pending_[end] = e;
  }
}

void OwedError::clear() {
  values_.clear();
  pending_.clear();
}

int64_t OwedError::pendingElements() const {
  int64_t total = 0;
  for (const auto& [begin, end] : pending_) total += end - begin;
  return total;
}

size_t residualBytes(size_t count, int nranks) {
  const size_t n = static_cast<size_t>(std::max(nranks, 1));
  const size_t chunk = (count + n - 1) / n;
  // worker (x2), server (x2), the accumulator and decoded scratch of a chunk
  return sizeof(float) * (2 * count + 4 * chunk) + count / 4;
}

}  // namespace squall::preload
