// The compressed reduce-scatter, ranks as threads, over every wire (the
// local transport, and tcp and ucx on loopback), checked bit for bit against
// the single-process reference (ReduceScatterReference in
// compressed_reference.h): every rank's output and residual, every codec,
// pieces that are not whole blocks, 1 to 4 ranks, sum and avg, segments;
// plus determinism, the non-finite rule, half-precision buffers, in place,
// the async form, error feedback, wire bytes against the formula, and the
// refusals (the other layout's state, a wrong recvcount, ranks that
// disagree).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "src/codec/numeric.h"
#include "tests/unit/coll_harness.h"
#include "tests/unit/compressed_reference.h"

namespace squall {
namespace {

using coll::Communicator;
using coll::CompressedState;
using testing::Group;
using testing::ReduceScatterReference;

class CompressedReduceScatter : public testing::WireTest {};

codec::Spec specOf(codec::CodecId id, uint32_t block, codec::Scale scale = codec::Scale::kMeanAbs) {
  codec::Spec spec;
  spec.codec = id;
  spec.block = block;
  spec.scale = scale;
  return spec;
}

std::vector<std::vector<float>> randomInputs(int n, size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> inputs(static_cast<size_t>(n), std::vector<float>(count));
  for (auto& v : inputs)
    for (float& x : v) x = normal(rng);
  return inputs;
}

bool sameBits(const float* a, const float* b, size_t count) {
  return count == 0 || std::memcmp(a, b, count * sizeof(float)) == 0;
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

std::string describe(int n, size_t recvcount, const codec::Spec& spec, ReduceOp op,
                     size_t segmentBytes) {
  char text[160];
  std::snprintf(text, sizeof(text), "n=%d recvcount=%zu %s/%u%s %s segment=%zu", n, recvcount,
                codec::codecName(spec.codec), spec.block,
                spec.scale == codec::Scale::kRms ? "/rms" : "", reduceOpName(op), segmentBytes);
  return text;
}

std::vector<std::unique_ptr<CompressedState>> statesFor(int n, size_t recvcount,
                                                        const codec::Spec& spec) {
  std::vector<std::unique_ptr<CompressedState>> states(static_cast<size_t>(n));
  for (auto& s : states)
    EXPECT_EQ(CompressedState::createReduceScatter(n, recvcount, spec, &s), Status::kOk)
        << lastError();
  return states;
}

// `calls` calls with fresh inputs on `group` and on the reference: every
// rank's output and residual equal the reference's bit for bit.
void checkAgainstReference(Group& group, size_t recvcount, const codec::Spec& spec, ReduceOp op,
                           size_t segmentBytes, int calls) {
  const int n = group.size();
  SCOPED_TRACE(describe(n, recvcount, spec, op, segmentBytes));
  for (int r = 0; r < n; ++r) group.comm(r).options().segmentBytes = segmentBytes;
  auto states = statesFor(n, recvcount, spec);
  ReduceScatterReference reference(n, recvcount, spec);
  const size_t count = recvcount * static_cast<size_t>(n);
  for (int call = 0; call < calls; ++call) {
    const auto inputs = randomInputs(n, count, 1000u * static_cast<unsigned>(call) + 7u);
    const auto expected = reference.run(inputs, op == ReduceOp::kAvg);
    std::vector<std::vector<float>> outputs(static_cast<size_t>(n), std::vector<float>(recvcount));
    group.run([&](Communicator& comm, int r) {
      EXPECT_EQ(comm.compressedReduceScatter(inputs[r].data(), outputs[r].data(), recvcount,
                                             DataType::kF32, op, states[r].get()),
                Status::kOk)
          << lastError();
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(sameBits(outputs[r].data(), expected[r].data(), recvcount))
          << "rank " << r << " call " << call << " differs from the reference";
      ASSERT_TRUE(sameBits(states[r]->worker().current(), reference.residual(r).data(), count))
          << "residual of rank " << r << " call " << call;
    }
  }
}

TEST_P(CompressedReduceScatter, MatchesReferenceForEveryCodecRankCountAndOp) {
  const codec::Spec specs[] = {specOf(codec::CodecId::kOnebit, 2048),
                               specOf(codec::CodecId::kOnebit, 64, codec::Scale::kRms),
                               specOf(codec::CodecId::kInt2, 64),
                               specOf(codec::CodecId::kInt4, 256),
                               specOf(codec::CodecId::kInt8, 64),
                               specOf(codec::CodecId::kBf16, 64),
                               specOf(codec::CodecId::kFp16, 64),
                               specOf(codec::CodecId::kNone, 64)};
  for (int n : {1, 2, 3, 4}) {
    Group group(n);
    for (const codec::Spec& spec : specs) {
      // Pieces shorter than a block, not a multiple of it, and just past one.
      for (size_t recvcount : {size_t{1}, size_t{1000}, size_t{2049}}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          for (size_t segmentBytes : {size_t{0}, size_t{1024}}) {
            checkAgainstReference(group, recvcount, spec, op, segmentBytes, 2);
          }
        }
      }
    }
  }
}

TEST_P(CompressedReduceScatter, LargePiecesMatchReference) {
  Group group(3);
  checkAgainstReference(group, (size_t{1} << 17) + 5, specOf(codec::CodecId::kOnebit, 2048),
                        ReduceOp::kAvg, size_t{1} << 16, 2);
  checkAgainstReference(group, 50000, specOf(codec::CodecId::kInt4, 256), ReduceOp::kSum,
                        size_t{1} << 16, 2);
}

TEST_P(CompressedReduceScatter, SameBytesRunToRun) {
  constexpr int kN = 4;
  constexpr size_t kRecv = 3000;
  const codec::Spec spec = specOf(codec::CodecId::kInt4, 256);
  const auto inputs = randomInputs(kN, kRecv * kN, 17);
  std::vector<std::vector<std::vector<float>>> runs;
  for (int run = 0; run < 2; ++run) {
    Group group(kN);
    auto states = statesFor(kN, kRecv, spec);
    std::vector<std::vector<float>> out(kN, std::vector<float>(kRecv));
    for (int call = 0; call < 3; ++call) {
      group.run([&](Communicator& comm, int r) {
        EXPECT_EQ(comm.compressedReduceScatter(inputs[r].data(), out[r].data(), kRecv,
                                               DataType::kF32, ReduceOp::kAvg, states[r].get()),
                  Status::kOk);
      });
    }
    runs.push_back(out);
  }
  for (int r = 0; r < kN; ++r)
    EXPECT_TRUE(sameBits(runs[0][r].data(), runs[1][r].data(), kRecv)) << "rank " << r;
}

TEST_P(CompressedReduceScatter, OneRankCopiesItsInputAndKeepsTheResidual) {
  Group group(1);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    auto states = statesFor(1, 1000, specOf(codec::CodecId::kOnebit, 64));
    const auto inputs = randomInputs(1, 1000, 5);
    std::vector<float> out(1000);
    EXPECT_EQ(group.comm(0).compressedReduceScatter(inputs[0].data(), out.data(), 1000,
                                                    DataType::kF32, op, states[0].get()),
              Status::kOk);
    EXPECT_TRUE(sameBits(out.data(), inputs[0].data(), 1000));
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(states[0]->worker().current()[i], 0.0f);
    EXPECT_STREQ(states[0]->lastStats().algorithm, "none");
    EXPECT_EQ(states[0]->lastStats().bytesSent, 0u);
  }
}

// Each rank sends (n - 1) encoded pieces and n - 1 verdict bytes: within a
// few percent of (n - 1)/n * count * (bits/8 + 4/B).
TEST_P(CompressedReduceScatter, WireBytesMatchTheFormula) {
  constexpr size_t kCount = size_t{1} << 18;
  struct Code {
    codec::Spec spec;
    double bits;
  };
  const Code codes[] = {{specOf(codec::CodecId::kOnebit, 2048), 1},
                        {specOf(codec::CodecId::kInt4, 256), 4},
                        {specOf(codec::CodecId::kInt8, 2048), 8}};
  for (int n : {2, 4}) {
    Group group(n);
    const size_t recvcount = kCount / static_cast<size_t>(n);
    for (const Code& code : codes) {
      auto states = statesFor(n, recvcount, code.spec);
      const auto inputs = randomInputs(n, kCount, 3);
      std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(recvcount));
      group.run([&](Communicator& comm, int r) {
        EXPECT_EQ(comm.compressedReduceScatter(inputs[r].data(), out[r].data(), recvcount,
                                               DataType::kF32, ReduceOp::kAvg, states[r].get()),
                  Status::kOk);
      });
      size_t pieceBytes = 0;
      ASSERT_EQ(codec::encodedSize(code.spec, recvcount, &pieceBytes), Status::kOk);
      const uint64_t exact = static_cast<uint64_t>(n - 1) * (pieceBytes + 1);
      const double model = static_cast<double>(n - 1) / n * static_cast<double>(kCount) *
                           (code.bits / 8 + 4.0 / code.spec.block);
      for (int r = 0; r < n; ++r) {
        const coll::CompressedStats& stats = states[r]->lastStats();
        EXPECT_STREQ(stats.algorithm, "reducescatter");
        EXPECT_EQ(stats.bytesSent, exact);
        EXPECT_EQ(stats.bytesReceived, exact);
        EXPECT_NEAR(static_cast<double>(stats.bytesSent) / model, 1.0, 0.02);
      }
      std::printf("n=%d count=%zu %s/%u: %llu bytes sent per rank (formula %.0f, fp32 %.0f)\n", n,
                  kCount, codec::codecName(code.spec.codec), code.spec.block,
                  static_cast<unsigned long long>(exact), model,
                  static_cast<double>(n - 1) / n * kCount * 4);
    }
  }
}

// A NaN in one rank's input: NaN in the outputs of its block on the rank
// that serves it, the reference's values elsewhere, and every rank's
// residual as it was (skipped); the next call is the reference's, which
// skipped the bad call too. For onebit (a block) and fp16 (an element
// beyond the fp16 range decodes to infinity).
TEST_P(CompressedReduceScatter, NonFiniteInputPoisonsItsBlockAndEveryRankKeepsItsResidual) {
  constexpr int kN = 4;
  constexpr size_t kRecv = 300;
  constexpr size_t kCount = kRecv * kN;
  for (const codec::Spec& spec :
       {specOf(codec::CodecId::kOnebit, 64), specOf(codec::CodecId::kFp16, 64)}) {
    const bool onebit = spec.codec == codec::CodecId::kOnebit;
    coll::Options options = testing::testOptions();
    options.segmentBytes = 256;
    Group group(kN, options);
    auto states = statesFor(kN, kRecv, spec);
    ReduceScatterReference reference(kN, kRecv, spec);
    for (int call = 0; call < 3; ++call) {
      auto inputs = randomInputs(kN, kCount, 50u + static_cast<unsigned>(call));
      // Rank 1's element 70 of piece 2 (block 1 of that piece, served by rank 2).
      if (call == 1) inputs[1][2 * kRecv + 70] = onebit ? std::nanf("") : 1e6f;
      std::vector<std::vector<float>> before(kN);
      for (int r = 0; r < kN; ++r)
        before[r].assign(states[r]->worker().current(), states[r]->worker().current() + kCount);
      const auto expected = reference.run(inputs, true);
      std::vector<std::vector<float>> out(kN, std::vector<float>(kRecv));
      group.run([&](Communicator& comm, int r) {
        EXPECT_EQ(comm.compressedReduceScatter(inputs[r].data(), out[r].data(), kRecv,
                                               DataType::kF32, ReduceOp::kAvg, states[r].get()),
                  Status::kOk);
      });
      const bool committed = call != 1;
      EXPECT_EQ(reference.committed, committed);
      for (int r = 0; r < kN; ++r) {
        for (size_t i = 0; i < kRecv; ++i) {
          const bool poisoned = call == 1 && r == 2 && (onebit ? i >= 64 && i < 128 : i == 70);
          ASSERT_EQ(!std::isfinite(out[r][i]), poisoned) << "rank " << r << " element " << i;
          if (onebit) {
            ASSERT_EQ(std::isnan(out[r][i]), poisoned);
          }
          ASSERT_EQ(!std::isfinite(expected[r][i]), poisoned);
          if (!poisoned) {
            ASSERT_EQ(out[r][i], expected[r][i]) << "rank " << r << " element " << i;
          }
        }
        EXPECT_EQ(sameBits(before[r].data(), states[r]->worker().current(), kCount), !committed)
            << "rank " << r << " call " << call;
        EXPECT_TRUE(sameBits(states[r]->worker().current(), reference.residual(r).data(), kCount))
            << "rank " << r << " call " << call;
        EXPECT_EQ(states[r]->worker().skipped(), call >= 1 ? 1u : 0u) << "rank " << r;
      }
    }
  }
}

TEST_P(CompressedReduceScatter, HalfPrecisionBuffersAreWidenedAndRounded) {
  constexpr int kN = 3;
  constexpr size_t kRecv = 1500;
  constexpr size_t kCount = kRecv * kN;
  const codec::Spec spec = specOf(codec::CodecId::kInt8, 256);
  coll::Options options = testing::testOptions();
  options.segmentBytes = 1024;
  Group group(kN, options);
  for (DataType dtype : {DataType::kF16, DataType::kBf16}) {
    auto toHalf = [&](float v) {
      return dtype == DataType::kF16 ? codec::floatToHalf(v) : codec::floatToBf16(v);
    };
    auto states = statesFor(kN, kRecv, spec);
    auto inputs = randomInputs(kN, kCount, 8);
    std::vector<std::vector<uint16_t>> halves(kN, std::vector<uint16_t>(kCount));
    for (int r = 0; r < kN; ++r)
      for (size_t i = 0; i < kCount; ++i) {
        halves[r][i] = toHalf(inputs[r][i]);
        inputs[r][i] = dtype == DataType::kF16 ? codec::halfToFloat(halves[r][i])
                                               : codec::bf16ToFloat(halves[r][i]);
      }
    ReduceScatterReference reference(kN, kRecv, spec);
    const auto expected = reference.run(inputs, false);
    std::vector<std::vector<uint16_t>> out(kN, std::vector<uint16_t>(kRecv));
    group.run([&](Communicator& comm, int r) {
      EXPECT_EQ(comm.compressedReduceScatter(halves[r].data(), out[r].data(), kRecv, dtype,
                                             ReduceOp::kSum, states[r].get()),
                Status::kOk);
    });
    for (int r = 0; r < kN; ++r)
      for (size_t i = 0; i < kRecv; ++i)
        ASSERT_EQ(out[r][i], toHalf(expected[r][i])) << "rank " << r << " element " << i;
  }
}

// The output may be this rank's piece of the input (NCCL's in place); the
// async form gives the blocking form's bytes.
TEST_P(CompressedReduceScatter, InPlaceAndAsyncMatchTheReference) {
  constexpr int kN = 3;
  constexpr size_t kRecv = 2500;
  const codec::Spec spec = specOf(codec::CodecId::kOnebit, 2048);
  Group group(kN);
  auto states = statesFor(kN, kRecv, spec);
  ReduceScatterReference reference(kN, kRecv, spec);
  for (int call = 0; call < 2; ++call) {
    auto inputs = randomInputs(kN, kRecv * kN, 21u + static_cast<unsigned>(call));
    const auto expected = reference.run(inputs, true);
    std::vector<std::vector<float>> out(kN, std::vector<float>(kRecv));
    group.run([&](Communicator& comm, int r) {
      float* piece = inputs[r].data() + static_cast<size_t>(r) * kRecv;
      if (call == 0) {
        EXPECT_EQ(comm.compressedReduceScatter(inputs[r].data(), piece, kRecv, DataType::kF32,
                                               ReduceOp::kAvg, states[r].get()),
                  Status::kOk)
            << lastError();
        out[r].assign(piece, piece + kRecv);
      } else {
        coll::OperationPtr op;
        EXPECT_EQ(
            comm.startCompressedReduceScatter(inputs[r].data(), out[r].data(), kRecv,
                                              DataType::kF32, ReduceOp::kAvg, states[r].get(), &op),
            Status::kOk);
        EXPECT_EQ(op->wait(), Status::kOk) << op->error();
      }
    });
    for (int r = 0; r < kN; ++r)
      EXPECT_TRUE(sameBits(out[r].data(), expected[r].data(), kRecv))
          << "rank " << r << " call " << call;
  }
}

// Constant inputs g_j: the running mean of rank r's outputs approaches the
// mean over j of g_j's piece r, and the residual stops growing.
TEST_P(CompressedReduceScatter, ErrorFeedbackConverges) {
  constexpr int kN = 4;
  constexpr size_t kRecv = 250;
  constexpr size_t kCount = kRecv * kN;
  constexpr int kCalls = 600;
  coll::Options options = testing::testOptions();
  options.segmentBytes = 512;
  Group group(kN, options);
  auto states = statesFor(kN, kRecv, specOf(codec::CodecId::kOnebit, 64));
  const auto g = randomInputs(kN, kCount, 99);
  std::vector<double> target(kCount, 0.0);
  for (int j = 0; j < kN; ++j)
    for (size_t i = 0; i < kCount; ++i) target[i] += g[j][i] / kN;
  std::vector<std::vector<double>> sums(kN, std::vector<double>(kRecv, 0.0));
  double firstError = 0;
  float maxResidual = 0, halfwayResidual = 0;
  for (int call = 0; call < kCalls; ++call) {
    group.run([&](Communicator& comm, int r) {
      std::vector<float> out(kRecv);
      EXPECT_EQ(comm.compressedReduceScatter(g[r].data(), out.data(), kRecv, DataType::kF32,
                                             ReduceOp::kAvg, states[r].get()),
                Status::kOk);
      for (size_t i = 0; i < kRecv; ++i) sums[r][i] += out[i];
    });
    for (int r = 0; r < kN; ++r) {
      for (size_t i = 0; i < kRecv; ++i) {
        if (call == 0)
          firstError = std::max(firstError, std::abs(sums[r][i] - target[r * kRecv + i]));
      }
      for (size_t i = 0; i < kCount; ++i)
        maxResidual = std::max(maxResidual, std::abs(states[r]->worker().current()[i]));
    }
    if (call == kCalls / 2) halfwayResidual = maxResidual;
  }
  double error = 0;
  for (int r = 0; r < kN; ++r)
    for (size_t i = 0; i < kRecv; ++i)
      error = std::max(error, std::abs(sums[r][i] / kCalls - target[r * kRecv + i]));
  EXPECT_LT(error, 0.1) << "running mean far from the mean input";
  EXPECT_LT(error, firstError / 10);
  EXPECT_LT(maxResidual, 1.05f * halfwayResidual) << "the residual keeps growing";
  EXPECT_LT(maxResidual, 200.0f);
  std::printf(
      "max |running mean - target| after 1 call %.3f, after %d calls %.4f; max "
      "|residual| %.2f\n",
      firstError, kCalls, error, maxResidual);
}

// Residuals stored in bf16: each call's output and residual are those of
// fp32 residuals rounded to bf16 after every commit, bit for bit (a
// non-finite call, committed by neither, included), they hold half the
// bytes, and error feedback still converges.
TEST_P(CompressedReduceScatter, Bf16ResidualsAreRoundedFp32Ones) {
  constexpr int kN = 3;
  constexpr size_t kRecv = 300;
  Group group(kN, testing::testOptions());
  const codec::Spec spec = specOf(codec::CodecId::kInt4, 64);
  auto fp32 = statesFor(kN, kRecv, spec);
  std::vector<std::unique_ptr<CompressedState>> bf16(kN);
  for (auto& s : bf16)
    ASSERT_EQ(CompressedState::createReduceScatter(kN, kRecv, spec, &s, coll::Feedback::kKept,
                                                   codec::ResidualStore::kBf16),
              Status::kOk);
  EXPECT_EQ(bf16[0]->residualBytes() * 2, fp32[0]->residualBytes());
  EXPECT_EQ(bf16[0]->residualStore(), codec::ResidualStore::kBf16);
  const auto g = randomInputs(kN, kRecv * kN, 5);
  std::vector<double> sums(kRecv * kN, 0.0);
  constexpr int kCalls = 200;
  for (int call = 0; call < kCalls; ++call) {
    auto in = g;
    if (call == 7) in[1][kRecv + 3] = std::nanf("");  // rank 1, rank 1's piece
    std::vector<std::vector<float>> out(kN, std::vector<float>(kRecv)), ref = out;
    group.run([&](Communicator& comm, int r) {
      EXPECT_EQ(comm.compressedReduceScatter(in[r].data(), out[r].data(), kRecv, DataType::kF32,
                                             ReduceOp::kAvg, bf16[r].get()),
                Status::kOk);
      EXPECT_EQ(comm.compressedReduceScatter(in[r].data(), ref[r].data(), kRecv, DataType::kF32,
                                             ReduceOp::kAvg, fp32[r].get()),
                Status::kOk);
    });
    for (int r = 0; r < kN; ++r) {
      for (size_t i = 0; i < kRecv; ++i) {
        ASSERT_EQ(codec::floatBits(out[r][i]), codec::floatBits(ref[r][i]))
            << "rank " << r << " call " << call << " element " << i;
      }
      codec::Residual& wide = fp32[r]->worker();
      codec::Residual& narrow = bf16[r]->worker();
      for (size_t i = 0; i < wide.count(); ++i) {
        wide.setValue(i, codec::bf16ToFloat(codec::floatToBf16(wide.value(i))));
        ASSERT_EQ(codec::floatBits(narrow.value(i)), codec::floatBits(wide.value(i)))
            << "rank " << r << " call " << call << " element " << i;
      }
      ASSERT_EQ(narrow.skipped(), call >= 7 ? 1u : 0u);
      if (call != 7) {
        for (size_t i = 0; i < kRecv; ++i) sums[r * kRecv + i] += out[r][i];
      }
    }
  }
  double error = 0;
  for (size_t i = 0; i < kRecv * kN; ++i)
    error = std::max(error, std::abs(sums[i] / (kCalls - 1) - (g[0][i] + g[1][i] + g[2][i]) / kN));
  EXPECT_LT(error, 0.02) << "bf16 residuals: the running mean is far from the mean input";
}

// Refused on every rank before anything is sent, with the output and the
// residual untouched, and the group still in step: the other layout's state
// (both ways), a recvcount that is not the state's, a state for another
// group size, a type or op the codec path does not take, overlapping
// buffers.
TEST_P(CompressedReduceScatter, RefusesTheWrongLayoutAndArguments) {
  constexpr int kN = 2;
  constexpr size_t kRecv = 100;
  const codec::Spec spec = specOf(codec::CodecId::kOnebit, 64);
  Group group(kN);
  group.run([&](Communicator& comm, int r) {
    std::unique_ptr<CompressedState> rs, ar, other;
    ASSERT_EQ(CompressedState::createReduceScatter(kN, kRecv, spec, &rs), Status::kOk);
    ASSERT_EQ(CompressedState::create(kN, kRecv * kN, spec, &ar), Status::kOk);
    ASSERT_EQ(CompressedState::createReduceScatter(kN + 1, kRecv, spec, &other), Status::kOk);
    EXPECT_TRUE(rs->reduceScatter());
    EXPECT_EQ(rs->count(), kRecv * kN);
    EXPECT_EQ(rs->chunk(), kRecv);
    std::vector<float> in(kRecv * kN, 1.0f), out(kRecv, -7.0f), all(kRecv * kN, -7.0f);
    EXPECT_EQ(
        comm.compressedAllReduce(in.data(), all.data(), DataType::kF32, ReduceOp::kAvg, rs.get()),
        Status::kInvalidUsage);
    EXPECT_TRUE(contains(lastError(), "made for the compressed reduce-scatter")) << lastError();
    EXPECT_EQ(comm.compressedReduceScatter(in.data(), out.data(), kRecv, DataType::kF32,
                                           ReduceOp::kAvg, ar.get()),
              Status::kInvalidUsage);
    EXPECT_TRUE(contains(lastError(), "made for the compressed allreduce")) << lastError();
    EXPECT_EQ(comm.compressedReduceScatter(in.data(), out.data(), kRecv + 1, DataType::kF32,
                                           ReduceOp::kAvg, rs.get()),
              Status::kInvalidArgument);
    EXPECT_TRUE(contains(lastError(), "recvcount is 101 but the state was made for 100"))
        << lastError();
    EXPECT_EQ(comm.compressedReduceScatter(in.data(), out.data(), kRecv, DataType::kF32,
                                           ReduceOp::kAvg, other.get()),
              Status::kInvalidUsage);
    EXPECT_TRUE(contains(lastError(), "created for 3 ranks")) << lastError();
    EXPECT_EQ(comm.compressedReduceScatter(in.data(), out.data(), kRecv, DataType::kF64,
                                           ReduceOp::kAvg, rs.get()),
              Status::kInvalidArgument);
    EXPECT_EQ(comm.compressedReduceScatter(in.data(), out.data(), kRecv, DataType::kF32,
                                           ReduceOp::kMax, rs.get()),
              Status::kInvalidArgument);
    EXPECT_EQ(comm.compressedReduceScatter(in.data(), in.data() + 1, kRecv, DataType::kF32,
                                           ReduceOp::kAvg, rs.get()),
              Status::kInvalidArgument);
    EXPECT_TRUE(contains(lastError(), "overlap")) << lastError();
    for (float v : out) ASSERT_EQ(v, -7.0f);
    for (float v : all) ASSERT_EQ(v, -7.0f);
    for (size_t i = 0; i < kRecv * kN; ++i) ASSERT_EQ(rs->worker().current()[i], 0.0f);
    // Still in step: a good call works (constant blocks are exact in onebit).
    std::vector<float> x(kRecv * kN, static_cast<float>(r + 1));
    ASSERT_EQ(comm.compressedReduceScatter(x.data(), out.data(), kRecv, DataType::kF32,
                                           ReduceOp::kSum, rs.get()),
              Status::kOk)
        << lastError();
    for (float v : out) ASSERT_EQ(v, 3.0f);
  });
  std::unique_ptr<CompressedState> bad;
  EXPECT_EQ(CompressedState::createReduceScatter(0, kRecv, spec, &bad), Status::kInvalidArgument);
  EXPECT_EQ(CompressedState::createReduceScatter(4, SIZE_MAX / 8, spec, &bad),
            Status::kInvalidArgument);
}

// Ranks that disagree on recvcount fail on every rank, before any output is
// written, and their residuals stay.
TEST_P(CompressedReduceScatter, RanksThatDisagreeFailWithoutWritingOutput) {
  constexpr int kN = 3;
  const codec::Spec spec = specOf(codec::CodecId::kOnebit, 64);
  Group group(kN);
  group.run([&](Communicator& comm, int r) {
    const size_t recv = r == 1 ? 400 : 500;
    std::unique_ptr<CompressedState> state;
    ASSERT_EQ(CompressedState::createReduceScatter(kN, recv, spec, &state), Status::kOk);
    std::vector<float> in(recv * kN, 1.0f), out(recv, -7.0f);
    EXPECT_NE(comm.compressedReduceScatter(in.data(), out.data(), recv, DataType::kF32,
                                           ReduceOp::kAvg, state.get()),
              Status::kOk);
    for (float v : out) ASSERT_EQ(v, -7.0f) << "rank " << r;
    EXPECT_EQ(state->worker().skipped(), 0u);
    for (size_t i = 0; i < recv * kN; ++i) ASSERT_EQ(state->worker().current()[i], 0.0f);
  });
}

INSTANTIATE_TEST_SUITE_P(Wires, CompressedReduceScatter, ::testing::ValuesIn(testing::allWires()),
                         testing::wireCaseName);

}  // namespace
}  // namespace squall
