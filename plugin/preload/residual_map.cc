#include "plugin/preload/residual_map.h"

#include <algorithm>
#include <numeric>

namespace squall::preload {

StepTracker::StepTracker(int64_t stepElements, int64_t learnCalls)
    : step_(stepElements),
      learnCalls_(std::max<int64_t>(2, learnCalls)),
      learning_(stepElements <= 0) {}

StepTracker::Placement StepTracker::place(size_t count, double seconds) {
  Placement p;
  const double gap = last_ < 0 ? 0 : seconds - last_;
  last_ = seconds;
  if (learning_) {
    window_.push_back(Seen{count, gap});
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
    window_.push_back(Seen{count, 0});
    return p;
  }
  p.known = true;
  p.offset = offset_;
  offset_ = offset_ + n == step_ ? 0 : offset_ + n;
  return p;
}

namespace {

// The shortest L such that the counts repeat with period L; 0 when none
// repeats at least twice in the window.
size_t repeatingPeriod(const std::vector<size_t>& counts) {
  for (size_t period = 1; 2 * period <= counts.size(); ++period) {
    bool repeats = true;
    for (size_t i = period; i < counts.size() && repeats; ++i)
      repeats = counts[i] == counts[i - period];
    if (repeats) return period;
  }
  return 0;
}

}  // namespace

void StepTracker::proposal(int64_t out[2], bool timing) const {
  out[0] = out[1] = 0;
  const size_t n = window_.size();
  if (n < 2) return;
  std::vector<size_t> counts(n);
  std::vector<int64_t> start(n + 1, 0);  // element offset of call i since the window began
  size_t largest = 0;
  for (size_t i = 0; i < n; ++i) {
    counts[i] = window_[i].count;
    start[i + 1] = start[i] + static_cast<int64_t>(counts[i]);
    largest = std::max(largest, counts[i]);
  }
  // Pauses: the gaps above the widest jump between sorted gaps, when that jump
  // is a clear one (3x); otherwise every call may start a step.
  std::vector<double> gaps;
  for (size_t i = 1; i < n; ++i) gaps.push_back(window_[i].gap);
  std::vector<double> sorted = gaps;
  std::sort(sorted.begin(), sorted.end());
  double threshold = -1, best = 3.0;
  for (size_t i = 0; i + 1 < sorted.size(); ++i) {
    const double ratio = sorted[i + 1] / std::max(sorted[i], 1e-7);
    if (ratio >= best) {
      best = ratio;
      threshold = sorted[i];
    }
  }
  std::vector<size_t> starts;  // calls that begin a step
  for (size_t i = 1; i < n; ++i)
    if (window_[i].gap > threshold) starts.push_back(i);
  int64_t step = 0, phase = 0;
  if (timing && starts.size() >= 2) {
    for (size_t k = 1; k < starts.size(); ++k)
      step = std::gcd(step, start[starts[k]] - start[starts[k - 1]]);
    phase = start[starts[0]];
  }
  // A length no call may cross; else fall back to repeating counts from the
  // first call (the first call of a communicator begins a step).
  auto fits = [&](int64_t length, int64_t origin) {
    if (length < static_cast<int64_t>(largest)) return false;
    for (size_t i = 0; i < n; ++i) {
      const int64_t at = ((start[i] - origin) % length + length) % length;
      if (at + static_cast<int64_t>(counts[i]) > length) return false;
    }
    return true;
  };
  if (step <= 0 || !fits(step, phase)) {
    const size_t period = repeatingPeriod(counts);
    step = period == 0 ? 0 : start[period];
    phase = 0;
    if (step > 0 && !fits(step, phase)) step = 0;
  }
  if (step <= 0) return;
  out[0] = step;
  out[1] = ((start[n] - phase) % step + step) % step;
}

void StepTracker::adopt(const int64_t in[2]) {
  window_.clear();
  learning_ = false;
  step_ = in[0];
  offset_ = in[0] > 0 ? in[1] : 0;
  // No step found: place nothing (calls run at full precision) and learn again.
  if (step_ <= 0) learning_ = true;
}

size_t residualBytes(size_t count, int nranks) {
  const size_t n = static_cast<size_t>(std::max(nranks, 1));
  const size_t chunk = (count + n - 1) / n;
  // worker (x2), server (x2), the accumulator and decoded scratch of a chunk
  return sizeof(float) * (2 * count + 4 * chunk) + count / 4;
}

}  // namespace squall::preload
