// Traffic patterns shared by the per-backend transport tests (and, later, the
// conformance suite): raw tags, a byte pattern that identifies sender,
// receiver and message, and an all-to-all exchange of every test size.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "src/transport/transport.h"

namespace squall::testing {

using namespace std::chrono_literals;
using transport::Clock;
using transport::Deadline;
using transport::RequestPtr;
using transport::Tag;
using transport::Transport;

inline Deadline soon(std::chrono::milliseconds after = 10s) { return Clock::now() + after; }

inline Tag rawTag(uint64_t sequence, uint32_t step) {
  Tag tag;
  tag.sequence = sequence;
  tag.step = step;
  return tag;
}

inline uint8_t pattern(int from, int to, size_t index, uint32_t salt) {
  return static_cast<uint8_t>(from * 31 + to * 7 + index * 13 + salt);
}

inline constexpr size_t kSizes[] = {0, 1, 7, 64, 1000, size_t{1} << 20};

// Every rank sends every size to every rank (itself included). Even ranks
// post their receives first, odd ranks their sends, so both expected and
// unexpected arrivals happen. Returns true when all data arrived intact.
inline bool exchangeAll(Transport& t, uint64_t sequence) {
  const int n = t.size(), me = t.rank();
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<RequestPtr> requests;
  auto postRecvs = [&] {
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < std::size(kSizes); ++i) {
        in.emplace_back(kSizes[i], 0);
        requests.emplace_back();
        EXPECT_EQ(t.recv(p, rawTag(sequence, i), in.back().data(), kSizes[i], &requests.back()),
                  Status::kOk);
      }
  };
  auto postSends = [&] {
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < std::size(kSizes); ++i) {
        out.emplace_back(kSizes[i]);
        for (size_t k = 0; k < kSizes[i]; ++k) out.back()[k] = pattern(me, p, k, i);
        requests.emplace_back();
        EXPECT_EQ(t.send(p, rawTag(sequence, i), out.back().data(), kSizes[i], &requests.back()),
                  Status::kOk);
      }
  };
  in.reserve(n * std::size(kSizes));
  out.reserve(n * std::size(kSizes));
  if (me % 2 == 0) {
    postRecvs();
    postSends();
  } else {
    postSends();
    postRecvs();
  }
  Status st = t.waitAll(requests, soon(30s));
  EXPECT_EQ(st, Status::kOk) << lastError();
  bool intact = st == Status::kOk;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < std::size(kSizes); ++i) {
      const std::vector<uint8_t>& got = in[p * std::size(kSizes) + i];
      for (size_t k = 0; k < got.size(); ++k)
        if (got[k] != pattern(p, me, k, i)) {
          ADD_FAILURE() << "rank " << me << ": byte " << k << " of size " << kSizes[i]
                        << " from rank " << p << " is wrong";
          intact = false;
          break;
        }
    }
  return intact;
}

}  // namespace squall::testing
