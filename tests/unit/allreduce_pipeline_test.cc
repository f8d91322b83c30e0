// The pipelined ring allreduce: every segment size gives the same bits as one
// segment per chunk, for every dtype, op and group size, in place and not,
// including chunks shorter than a segment, empty chunks (count < n) and the
// scratch reused across calls of different sizes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "src/coll/communicator.h"
#include "tests/unit/coll_harness.h"

namespace squall {
namespace {

using coll::AllReduceAlgo;
using coll::Communicator;
using testing::Group;

std::vector<uint8_t> inputOf(int rank, size_t count, DataType dtype) {
  std::mt19937 rng(static_cast<unsigned>(rank) * 7919u + static_cast<unsigned>(count));
  std::vector<uint8_t> bytes(count * dataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float v = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
    switch (dtype) {
      case DataType::kF32: std::memcpy(&bytes[i * 4], &v, 4); break;
      case DataType::kF64: {
        const double d = v;
        std::memcpy(&bytes[i * 8], &d, 8);
        break;
      }
      case DataType::kI32: {
        const auto x = static_cast<int32_t>(v * 1000);
        std::memcpy(&bytes[i * 4], &x, 4);
        break;
      }
      case DataType::kI64: {
        const auto x = static_cast<int64_t>(v * 100000);
        std::memcpy(&bytes[i * 8], &x, 8);
        break;
      }
      default: {  // fp16 / bf16: any 16-bit pattern of a small finite value
        const auto h = static_cast<uint16_t>(0x3c00u + (rng() % 0x300u));
        std::memcpy(&bytes[i * 2], &h, 2);
      }
    }
  }
  return bytes;
}

std::vector<std::vector<uint8_t>> run(int n, size_t count, DataType dtype, ReduceOp op,
                                      size_t segmentBytes, bool inPlace, size_t maxSegments = 0) {
  coll::Options options = testing::testOptions();
  options.allReduceAlgo = AllReduceAlgo::kRing;
  options.segmentBytes = segmentBytes;
  options.ringMaxSegments = maxSegments;  // 0: the tiny segments asked for, however many
  Group group(n, options);
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  group.run([&](Communicator& comm, int r) {
    // A first, larger call grows the scratch; the second must not depend on it.
    std::vector<uint8_t> warm = inputOf(r, count * 3 + 5, dtype);
    EXPECT_EQ(comm.allReduce(warm.data(), warm.data(), count * 3 + 5, dtype, op), Status::kOk);
    std::vector<uint8_t> in = inputOf(r, count, dtype);
    out[r].assign(in.size(), 0xee);
    void* target = inPlace ? static_cast<void*>(in.data()) : out[r].data();
    EXPECT_EQ(comm.allReduce(in.data(), target, count, dtype, op), Status::kOk);
    if (inPlace) out[r] = in;
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(out[r], out[0]) << "rank " << r << " differs";
  return out;
}

TEST(RingPipeline, SegmentedEqualsUnsegmentedBitForBit) {
  for (int n : {2, 3, 4, 5}) {
    for (size_t count : {size_t{1}, size_t{3}, size_t{100}, size_t{4099}}) {
      for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBf16, DataType::kF64,
                             DataType::kI32, DataType::kI64}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          const auto whole = run(n, count, dtype, op, 0, false);
          for (size_t seg : {size_t{16}, size_t{200}}) {
            const bool inPlace = seg == 200;
            const auto piped = run(n, count, dtype, op, seg, inPlace);
            ASSERT_EQ(piped[0], whole[0])
                << "n " << n << " count " << count << " dtype " << dataTypeName(dtype) << " op "
                << reduceOpName(op) << " segment " << seg;
          }
          // Capped at 3 segments per chunk: the segments grow, the bits stay.
          ASSERT_EQ(run(n, count, dtype, op, 16, false, 3)[0], whole[0])
              << "n " << n << " count " << count << " dtype " << dataTypeName(dtype) << " op "
              << reduceOpName(op) << " capped";
        }
      }
    }
  }
}

// Both algorithms read the input where it is (no private copy of it any
// more): out of place it must come back untouched, and the result must not
// depend on whether the output started as a copy of the input.
TEST(RingPipeline, InputIsLeftUntouchedOutOfPlace) {
  for (AllReduceAlgo algo :
       {AllReduceAlgo::kRing, AllReduceAlgo::kDirect, AllReduceAlgo::kHalvingDoubling}) {
    for (int n : {2, 3, 4, 6}) {
      coll::Options options = testing::testOptions();
      options.allReduceAlgo = algo;
      options.segmentBytes = 64;
      Group group(n, options);
      for (DataType dtype : {DataType::kF32, DataType::kBf16, DataType::kI64}) {
        constexpr size_t kCount = 1001;
        std::vector<std::vector<uint8_t>> fresh(static_cast<size_t>(n)),
            copied(static_cast<size_t>(n));
        group.run([&](Communicator& comm, int r) {
          const std::vector<uint8_t> original = inputOf(r, kCount, dtype);
          std::vector<uint8_t> in = original;
          fresh[r].assign(in.size(), 0x5a);
          EXPECT_EQ(comm.allReduce(in.data(), fresh[r].data(), kCount, dtype, ReduceOp::kSum),
                    Status::kOk);
          EXPECT_EQ(in, original) << "the input of rank " << r << " changed";
          copied[r] = in;
          EXPECT_EQ(comm.allReduce(in.data(), copied[r].data(), kCount, dtype, ReduceOp::kSum),
                    Status::kOk);
        });
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(fresh[r], fresh[0]) << "rank " << r << " differs";
          EXPECT_EQ(copied[r], fresh[0]) << "rank " << r << ": output's start leaked in";
        }
      }
    }
  }
}

// One rank enters each call late, so its left neighbour's reduce-scatter
// messages (whose receives land in the output out of place) and its
// all-gather messages arrive before their receives are posted: over tcp they
// are buffered and handed over, and the bits must not change. Every dtype,
// uneven counts, in place and not, the late rank rotating.
TEST(RingPipeline, LateRankGetsTheSameBits) {
  constexpr size_t kCount = 1001;
  const auto dtypes = {DataType::kF32, DataType::kF16, DataType::kBf16,
                       DataType::kF64, DataType::kI32, DataType::kI64};
  for (int n : {3, 4}) {
    std::map<std::pair<DataType, ReduceOp>, std::vector<uint8_t>> expected;
    for (DataType dtype : dtypes)
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin})
        expected[{dtype, op}] = run(n, kCount, dtype, op, 0, false)[0];
    for (testing::Wire wire : {testing::Wire::kLocal, testing::Wire::kTcp}) {
      const testing::Wire saved = testing::currentWire();
      testing::currentWire() = wire;
      coll::Options options = testing::testOptions();
      options.allReduceAlgo = AllReduceAlgo::kRing;
      options.segmentBytes = 64;
      options.ringMaxSegments = 0;
      Group group(n, options);
      int call = 0;
      for (DataType dtype : dtypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
          for (bool inPlace : {false, true}) {
            const int late = call++ % n;
            std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
            group.run([&](Communicator& comm, int r) {
              std::vector<uint8_t> in = inputOf(r, kCount, dtype);
              out[r].assign(in.size(), 0xee);
              void* target = inPlace ? static_cast<void*>(in.data()) : out[r].data();
              if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
              EXPECT_EQ(comm.allReduce(in.data(), target, kCount, dtype, op), Status::kOk);
              if (inPlace) out[r] = in;
            });
            for (int r = 0; r < n; ++r)
              ASSERT_EQ(out[r], (expected[{dtype, op}]))
                  << "wire " << testing::wireName(wire) << " n " << n << " dtype "
                  << dataTypeName(dtype) << " op " << reduceOpName(op)
                  << (inPlace ? " in place" : "") << " late rank " << late << ": rank " << r
                  << " differs";
          }
        }
      }
      testing::currentWire() = saved;
    }
  }
}

TEST(RingPipeline, SumIsExactForIntegers) {
  constexpr int kN = 4;
  constexpr size_t kCount = 10007;
  coll::Options options = testing::testOptions();
  options.allReduceAlgo = AllReduceAlgo::kRing;
  options.segmentBytes = 4096;
  Group group(kN, options);
  group.run([&](Communicator& comm, int r) {
    std::vector<int64_t> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<int64_t>(i) * (r + 1);
    ASSERT_EQ(comm.allReduce(x.data(), x.data(), kCount, DataType::kI64, ReduceOp::kSum),
              Status::kOk);
    for (size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(x[i], static_cast<int64_t>(i) * 10) << "element " << i;
  });
}

}  // namespace
}  // namespace squall
