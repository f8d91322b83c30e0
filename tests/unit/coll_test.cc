// Full-precision collectives, ranks as threads, over every wire (the local
// transport, and tcp and ucx on loopback), checked against closed-form values.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "src/codec/numeric.h"
#include "src/coll/reduce.h"
#include "tests/unit/coll_harness.h"

namespace squall {
namespace {

using coll::AllReduceAlgo;
using coll::Communicator;
using testing::Group;

class Collectives : public testing::WireTest {};

constexpr int kRankCounts[] = {1, 2, 3, 4, 5, 8};
constexpr DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBf16,
                               DataType::kF64, DataType::kI32, DataType::kI64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};

// Small integers, so every sum is exact in every data type (|sum| <= 48).
int contribution(int rank, size_t i) {
  return static_cast<int>((static_cast<size_t>(rank) + 1) * (i + 3) % 13) - 6;
}

void store(DataType dtype, double v, void* base, size_t i) {
  auto* p = static_cast<uint8_t*>(base);
  switch (dtype) {
    case DataType::kF32: {
      float f = static_cast<float>(v);
      std::memcpy(p + 4 * i, &f, 4);
      break;
    }
    case DataType::kF64: std::memcpy(p + 8 * i, &v, 8); break;
    case DataType::kF16: {
      uint16_t h = codec::floatToHalf(static_cast<float>(v));
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    case DataType::kBf16: {
      uint16_t h = codec::floatToBf16(static_cast<float>(v));
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    case DataType::kI32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p + 4 * i, &x, 4);
      break;
    }
    case DataType::kI64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p + 8 * i, &x, 8);
      break;
    }
  }
}

double load(DataType dtype, const void* base, size_t i) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (dtype) {
    case DataType::kF32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DataType::kF64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return d;
    }
    case DataType::kF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return codec::halfToFloat(h);
    }
    case DataType::kBf16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return codec::bf16ToFloat(h);
    }
    case DataType::kI32: {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case DataType::kI64: {
      int64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      return static_cast<double>(x);
    }
  }
  return 0;
}

// The closed-form result of element i.
double expected(DataType dtype, ReduceOp op, int n, size_t i) {
  int sum = 0, lo = 1000, hi = -1000;
  for (int r = 0; r < n; ++r) {
    const int v = contribution(r, i);
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case ReduceOp::kSum: return sum;
    case ReduceOp::kMin: return lo;
    case ReduceOp::kMax: return hi;
    case ReduceOp::kAvg: break;
  }
  switch (dtype) {
    case DataType::kF32: return static_cast<float>(sum) / static_cast<float>(n);
    case DataType::kF64: return static_cast<double>(sum) / n;
    case DataType::kF16:
      return codec::halfToFloat(
          codec::floatToHalf(static_cast<float>(sum) / static_cast<float>(n)));
    case DataType::kBf16:
      return codec::bf16ToFloat(
          codec::floatToBf16(static_cast<float>(sum) / static_cast<float>(n)));
    case DataType::kI32:
    // Integer avg truncates toward zero, as the library's does.
    case DataType::kI64: return sum / n;  // NOLINT(bugprone-integer-division)
  }
  return 0;
}

void checkAllReduce(Group& group, size_t count, DataType dtype, ReduceOp op, bool inPlace) {
  const int n = group.size();
  const size_t bytes = count * dataTypeSize(dtype);
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(bytes)),
      out(n, std::vector<uint8_t>(bytes));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) store(dtype, contribution(r, i), in[r].data(), i);
  group.run([&](Communicator& c, int r) {
    void* dst = inPlace ? in[r].data() : out[r].data();
    EXPECT_EQ(c.allReduce(in[r].data(), dst, count, dtype, op), Status::kOk) << lastError();
  });
  for (int r = 0; r < n; ++r) {
    const auto& result = inPlace ? in[r] : out[r];
    EXPECT_EQ(result, inPlace ? in[0] : out[0]) << "rank " << r << " differs from rank 0";
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(load(dtype, result.data(), i), expected(dtype, op, n, i))
          << "n=" << n << " count=" << count << " " << dataTypeName(dtype) << " "
          << reduceOpName(op) << " rank " << r << " element " << i;
    }
  }
}

TEST_P(Collectives, AllReduceEveryTypeOpAndAlgorithm) {
  for (int n : kRankCounts) {
    for (AllReduceAlgo algo :
         {AllReduceAlgo::kRing, AllReduceAlgo::kDirect, AllReduceAlgo::kHalvingDoubling}) {
      coll::Options options = testing::testOptions();
      options.allReduceAlgo = algo;
      Group group(n, options);
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}}) {
        for (DataType dtype : kTypes) {
          for (ReduceOp op : kOps) checkAllReduce(group, count, dtype, op, count == 7);
        }
      }
    }
  }
}

TEST_P(Collectives, AllReduceLargeAndAuto) {
  for (int n : {3, 8}) {
    Group group(n);  // auto: direct to 32 KiB, rhd to 256 KiB, ring above
    checkAllReduce(group, (1 << 20) + 3, DataType::kF32, ReduceOp::kSum, false);
    checkAllReduce(group, 1 << 16, DataType::kBf16, ReduceOp::kAvg, true);
    checkAllReduce(group, 100, DataType::kI64, ReduceOp::kMax, false);
    checkAllReduce(group, 40000 + 1, DataType::kF32, ReduceOp::kAvg, false);  // rhd
    checkAllReduce(group, 30000, DataType::kF64, ReduceOp::kMin, true);       // rhd
  }
}

std::vector<uint8_t> randomBytes(size_t bytes, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(bytes);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_P(Collectives, AllGatherAllToAllBroadcast) {
  for (int n : kRankCounts) {
    Group group(n);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}}) {
      for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kI64}) {
        const size_t bytes = count * dataTypeSize(dtype);
        const size_t nb = bytes * static_cast<size_t>(n);
        std::vector<std::vector<uint8_t>> in(n), gathered(n, std::vector<uint8_t>(nb)), a2aIn(n),
            a2aOut(n, std::vector<uint8_t>(nb)), bcast(n);
        for (int r = 0; r < n; ++r) {
          in[r] = randomBytes(bytes, 11u * r + 1);
          a2aIn[r] = randomBytes(nb, 13u * r + 2);
          bcast[r] = randomBytes(bytes, 17u * r + 3);
        }
        const int root = n - 1;
        const std::vector<uint8_t> rootData = bcast[root];
        group.run([&](Communicator& c, int r) {
          EXPECT_EQ(c.allGather(in[r].data(), gathered[r].data(), count, dtype), Status::kOk);
          EXPECT_EQ(c.allToAll(a2aIn[r].data(), a2aOut[r].data(), count, dtype), Status::kOk);
          EXPECT_EQ(c.broadcast(bcast[r].data(), count, dtype, root), Status::kOk);
        });
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(bcast[r], rootData);
          for (int j = 0; j < n && bytes != 0; ++j) {
            EXPECT_EQ(0, std::memcmp(gathered[r].data() + j * bytes, in[j].data(), bytes));
            EXPECT_EQ(0,
                      std::memcmp(a2aOut[r].data() + j * bytes, a2aIn[j].data() + r * bytes, bytes))
                << "alltoall n=" << n << " rank " << r << " block " << j;
          }
        }
      }
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  Group group(5);
  for (int root = 0; root < 5; ++root) {
    std::vector<std::vector<int32_t>> data(5, std::vector<int32_t>(33, -1));
    for (int i = 0; i < 33; ++i) data[root][i] = root * 100 + i;
    group.run([&](Communicator& c, int r) {
      EXPECT_EQ(c.broadcast(data[r].data(), 33, DataType::kI32, root), Status::kOk);
    });
    for (int r = 0; r < 5; ++r) EXPECT_EQ(data[r], data[root]);
  }
}

TEST_P(Collectives, BarrierHoldsEveryRank) {
  for (int n : kRankCounts) {
    Group group(n);
    std::atomic<int> entered{0};
    group.run([&](Communicator& c, int r) {
      std::this_thread::sleep_for(std::chrono::milliseconds(r == 0 ? 20 : 0));
      entered.fetch_add(1);
      EXPECT_EQ(c.barrier(), Status::kOk);
      EXPECT_EQ(entered.load(), n) << "rank " << r << " left the barrier early";
    });
  }
}

TEST_P(Collectives, AsyncOperationsRunInOrder) {
  Group group(4);
  constexpr size_t kCount = 5000;
  std::vector<std::vector<float>> a(4, std::vector<float>(kCount)),
      b(4, std::vector<float>(kCount));
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < kCount; ++i) {
      a[r][i] = static_cast<float>(r + i);
      b[r][i] = static_cast<float>(r);
    }
  group.run([&](Communicator& c, int r) {
    coll::OperationPtr first, second, third;
    EXPECT_EQ(
        c.startAllReduce(a[r].data(), a[r].data(), kCount, DataType::kF32, ReduceOp::kSum, &first),
        Status::kOk);
    EXPECT_EQ(
        c.startAllReduce(b[r].data(), b[r].data(), kCount, DataType::kF32, ReduceOp::kMax, &second),
        Status::kOk);
    EXPECT_EQ(c.startBarrier(&third), Status::kOk);
    EXPECT_EQ(second->wait(), Status::kOk);
    EXPECT_TRUE(first->test());  // finished before the second started
    EXPECT_EQ(first->wait(), Status::kOk);
    EXPECT_EQ(third->wait(), Status::kOk);
    int32_t x = r;
    EXPECT_EQ(c.allReduce(&x, &x, 1, DataType::kI32, ReduceOp::kSum),
              Status::kOk);  // blocking after async
    EXPECT_EQ(x, 6);
  });
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(a[r][i], static_cast<float>(6 + 4 * i));
      ASSERT_EQ(b[r][i], 3.0f);
    }
}

// A rank that refuses its own arguments tells the others, who are already
// waiting in the collective: they fail at once (not after the 30 s deadline)
// with its reason, for blocking and async calls, and the group stays usable.
TEST_P(Collectives, ARanksBadArgumentFailsItsPeersAtOnce) {
  Group group(3);
  std::vector<Status> status(3);
  std::vector<std::string> message(3);
  std::vector<std::vector<float>> data(3, std::vector<float>(100, 1.0f));
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    const auto begin = std::chrono::steady_clock::now();
    group.run([&](Communicator& c, int r) {
      clearLastError();
      float* buffer = r == 1 ? nullptr : data[r].data();  // rank 1 passes a NULL buffer
      if (!async) {
        status[r] = c.allReduce(buffer, buffer, 100, DataType::kF32, ReduceOp::kSum);
      } else {
        coll::OperationPtr op;
        status[r] = c.startAllReduce(buffer, buffer, 100, DataType::kF32, ReduceOp::kSum, &op);
        if (status[r] == Status::kOk) status[r] = op->wait();
        if (op != nullptr && status[r] != Status::kOk) setLastError(op->error());
      }
      message[r] = lastError();
    });
    EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(3)) << "a rank hung";
    EXPECT_EQ(status[1], Status::kInvalidArgument);
    EXPECT_NE(message[1].find("NULL"), std::string::npos) << message[1];
    for (int r : {0, 2}) {
      EXPECT_EQ(status[r], Status::kRemoteError) << "rank " << r << ": " << message[r];
      EXPECT_NE(message[r].find("rank 1"), std::string::npos) << message[r];
      EXPECT_NE(message[r].find("NULL"), std::string::npos) << message[r];
    }
    // The next collective lines up on every rank.
    group.run([&](Communicator& c, int r) {
      int64_t x = r + 1;
      EXPECT_EQ(c.allReduce(&x, &x, 1, DataType::kI64, ReduceOp::kSum), Status::kOk) << lastError();
      EXPECT_EQ(x, 6);
    });
  }
}

TEST_P(Collectives, MismatchedCallsFailOnEveryRank) {
  coll::Options options = testing::testOptions();
  for (AllReduceAlgo algo :
       {AllReduceAlgo::kRing, AllReduceAlgo::kDirect, AllReduceAlgo::kHalvingDoubling}) {
    options.allReduceAlgo = algo;
    Group group(4, options);
    std::vector<Status> status(4);
    std::vector<std::string> message(4);
    std::vector<std::vector<float>> data(4, std::vector<float>(100, 1.0f));
    const auto begin = std::chrono::steady_clock::now();
    group.run([&](Communicator& c, int r) {
      clearLastError();
      status[r] = c.allReduce(data[r].data(), data[r].data(), r == 2 ? 99 : 100, DataType::kF32,
                              r == 3 ? ReduceOp::kMax : ReduceOp::kSum);
      message[r] = lastError();
    });
    // The mismatch is seen by the ranks that exchange with the odd ones; they
    // send abort notices, so nobody waits for the (30 s) deadline.
    EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(1)) << "a rank hung";
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(status[r] == Status::kInvalidUsage || status[r] == Status::kRemoteError)
          << "rank " << r << ": " << statusName(status[r]) << " " << message[r];
      EXPECT_NE(message[r].find("#0 allreduce"), std::string::npos) << message[r];
    }
    // The group stays usable: the next operation has a fresh sequence number.
    group.run([&](Communicator& c, int r) {
      int64_t x = r;
      EXPECT_EQ(c.allReduce(&x, &x, 1, DataType::kI64, ReduceOp::kSum), Status::kOk) << lastError();
      EXPECT_EQ(x, 6);
    });
  }
}

TEST_P(Collectives, AbsentRankTimesOutEveryoneQuickly) {
  coll::Options options = testing::testOptions();
  options.timeout = std::chrono::milliseconds(300);
  for (AllReduceAlgo algo :
       {AllReduceAlgo::kRing, AllReduceAlgo::kDirect, AllReduceAlgo::kHalvingDoubling}) {
    options.allReduceAlgo = algo;
    Group group(5, options);
    std::vector<Status> status(5, Status::kOk);
    std::vector<float> data(size_t{5} * 1000, 1.0f);
    const auto begin = std::chrono::steady_clock::now();
    group.run([&](Communicator& c, int r) {
      if (r == 3) return;  // never calls
      const size_t at = static_cast<size_t>(r) * 1000;
      status[r] =
          c.allReduce(data.data() + at, data.data() + at, 1000, DataType::kF32, ReduceOp::kSum);
    });
    EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(2));
    for (int r = 0; r < 5; ++r) {
      if (r == 3) continue;
      EXPECT_TRUE(status[r] == Status::kTimeout || status[r] == Status::kRemoteError)
          << "rank " << r << ": " << statusName(status[r]);
    }
  }
}

TEST_P(Collectives, RejectsBadArguments) {
  Group group(1);
  Communicator& c = group.comm(0);
  float x = 0;
  EXPECT_EQ(c.allReduce(nullptr, &x, 1, DataType::kF32, ReduceOp::kSum), Status::kInvalidArgument);
  EXPECT_EQ(c.allReduce(&x, &x, 1, static_cast<DataType>(9), ReduceOp::kSum),
            Status::kInvalidArgument);
  EXPECT_EQ(c.allReduce(&x, &x, 1, DataType::kF32, static_cast<ReduceOp>(9)),
            Status::kInvalidArgument);
  EXPECT_EQ(c.broadcast(&x, 1, DataType::kF32, 1), Status::kInvalidArgument);
  EXPECT_EQ(c.allToAll(&x, &x, 1, DataType::kF32), Status::kInvalidUsage);
}

INSTANTIATE_TEST_SUITE_P(Wires, Collectives, ::testing::ValuesIn(testing::allWires()),
                         testing::wireCaseName);

}  // namespace
}  // namespace squall
