// The interposer's decisions without MPI or NCCL: policy, step placement,
// the residual map and the report.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "plugin/preload/policy.h"
#include "plugin/preload/report.h"
#include "plugin/preload/residual_map.h"

namespace squall::preload {
namespace {

TEST(PreloadPolicy, JudgesFromTheCallsFactsOnly) {
  Policy p;
  p.minBytes = 1024;
  CallFacts f;
  f.count = 1024;
  f.dtypeKnown = f.opKnown = true;
  EXPECT_EQ(p.judge(f), Verdict::kCompress);
  f.op = ReduceOp::kMax;
  EXPECT_EQ(p.judge(f), Verdict::kOp);
  f.op = ReduceOp::kAvg;
  EXPECT_EQ(p.judge(f), Verdict::kCompress);
  p.avg = false;
  EXPECT_EQ(p.judge(f), Verdict::kOp);
  f.op = ReduceOp::kSum;
  f.dtype = DataType::kF64;
  EXPECT_EQ(p.judge(f), Verdict::kType);
  f.dtype = DataType::kBf16;
  f.count = 511;  // 1022 bytes
  EXPECT_EQ(p.judge(f), Verdict::kSmall);
  f.count = 512;
  EXPECT_EQ(p.judge(f), Verdict::kCompress);
  p.dtypes[2] = false;
  EXPECT_EQ(p.judge(f), Verdict::kType);
  f.opKnown = false;
  f.dtype = DataType::kF32;
  EXPECT_EQ(p.judge(f), Verdict::kOp);
  p.enabled = false;
  EXPECT_EQ(p.judge(f), Verdict::kDisabled);
}

TEST(PreloadPolicy, ReadsTheEnvironment) {
  setenv("SQUALL_PRELOAD_CODEC", "int8:block=256", 1);
  setenv("SQUALL_PRELOAD_DTYPES", "fp32", 1);
  setenv("SQUALL_PRELOAD_OPS", "sum", 1);
  setenv("SQUALL_PRELOAD_RESIDUAL_MB", "3", 1);
  Policy p = Policy::fromEnvironment();
  EXPECT_EQ(p.codec.codec, codec::CodecId::kInt8);
  EXPECT_EQ(p.codec.block, 256u);
  EXPECT_TRUE(p.dtypes[0]);
  EXPECT_FALSE(p.dtypes[1] || p.dtypes[2]);
  EXPECT_TRUE(p.sum);
  EXPECT_FALSE(p.avg);
  EXPECT_EQ(p.residualCapBytes, size_t{3} << 20);
  setenv("SQUALL_PRELOAD_CODEC", "none", 1);  // not a compression: the default stays
  setenv("SQUALL_PRELOAD_DTYPES", "fp32,int4", 1);
  p = Policy::fromEnvironment();
  EXPECT_EQ(p.codec.codec, codec::CodecId::kOnebit);
  EXPECT_TRUE(p.dtypes[0] && p.dtypes[1] && p.dtypes[2]);
  for (const char* v : {"SQUALL_PRELOAD_CODEC", "SQUALL_PRELOAD_DTYPES", "SQUALL_PRELOAD_OPS",
                        "SQUALL_PRELOAD_RESIDUAL_MB"})
    unsetenv(v);
}

TEST(PreloadSteps, AGivenStepPlacesCallsByOffset) {
  StepTracker t(300, 8);
  for (int step = 0; step < 3; ++step) {
    // The same 300 elements, split differently each step.
    std::vector<size_t> split =
        step == 1 ? std::vector<size_t>{300} : std::vector<size_t>{100, 200};
    int64_t expect = 0;
    for (size_t n : split) {
      auto at = t.place(n);
      ASSERT_TRUE(at.known);
      EXPECT_EQ(at.offset, expect);
      expect += static_cast<int64_t>(n);
    }
  }
  // A call crossing the step's end: nothing is placed, learn again.
  t.place(100);
  auto at = t.place(250);
  EXPECT_FALSE(at.known);
  EXPECT_TRUE(at.relearn);
  EXPECT_EQ(t.relearns(), 1u);
}

// Feeds the steps' calls as one learning window; returns the proposal.
std::vector<int64_t> learn(const std::vector<std::vector<size_t>>& steps) {
  size_t total = 0;
  for (auto& s : steps) total += s.size();
  StepTracker t(0, static_cast<int64_t>(total));
  bool agreed = false;
  for (auto& s : steps) {
    for (size_t n : s) {
      auto at = t.place(n);
      EXPECT_FALSE(at.known);
      agreed = at.agree;
    }
  }
  EXPECT_TRUE(agreed);
  int64_t out[2];
  t.proposal(out);
  return {out[0], out[1]};
}

TEST(PreloadSteps, LearnsTheStepDespiteFusionChanges) {
  // Horovod-like: 1000 elements per step fused differently each step.
  auto p = learn({{400, 600}, {1000}, {400, 100, 500}, {900, 100}});
  EXPECT_EQ(p[0], 1000);
  EXPECT_EQ(p[1], 0);
  // A span that some call would cross is never the step.
  EXPECT_EQ(learn({{300, 700}, {700, 300}, {300, 700}})[0], 1000);
  // The window may end inside a step: the next call's offset says where.
  p = learn({{400, 600}, {1000}, {400}});
  EXPECT_EQ(p[0], 1000);
  EXPECT_EQ(p[1], 400);
}

TEST(PreloadSteps, RepeatingCounts) {
  // DDP-like fixed buckets.
  auto p = learn({{700, 700, 300}, {700, 700, 300}, {700, 700, 300}});
  EXPECT_EQ(p[0], 1700);
  EXPECT_EQ(p[1], 0);
  // 700,700,300,700 has no step seen twice: none, and learning starts again.
  StepTracker t(0, 4);
  for (size_t n : {700, 700, 300, 700}) t.place(n);
  int64_t out[2];
  t.proposal(out);
  t.adopt(out);
  EXPECT_EQ(t.stepElements(), 0);
  EXPECT_FALSE(t.place(700).known);
}

TEST(PreloadSteps, IdenticalBlocksLookLikeOne) {
  // Ten equal layers, each its own call: counts alone give one layer's span,
  // the documented case for SQUALL_PRELOAD_STEP_ELEMENTS.
  std::vector<size_t> step;
  for (int i = 0; i < 10; ++i) step.insert(step.end(), {1000, 10});
  EXPECT_EQ(learn({step, step})[0], 1010);
}

TEST(PreloadResiduals, EvictsLeastRecentlyUsedWithinTheCap) {
  ResidualMap<int> m(100);
  const ResidualKey a{DataType::kF32, 0, 10}, b{DataType::kF32, 10, 10}, c{DataType::kF16, 0, 10};
  EXPECT_TRUE(m.insert(a, std::make_unique<int>(1), 40));
  EXPECT_TRUE(m.insert(b, std::make_unique<int>(2), 40));
  ASSERT_NE(m.find(a), nullptr);  // a is now the most recent
  EXPECT_TRUE(m.insert(c, std::make_unique<int>(3), 40));
  EXPECT_EQ(m.find(b), nullptr);  // b evicted
  EXPECT_EQ(*m.find(a), 1);
  EXPECT_EQ(*m.find(c), 3);
  EXPECT_EQ(m.evictions(), 1u);
  EXPECT_EQ(m.usedBytes(), 80u);
  EXPECT_FALSE(m.insert(b, std::make_unique<int>(4), 101));
  EXPECT_FALSE(m.fits(101));
  m.clear();
  EXPECT_EQ(m.size(), 0u);
}

TEST(PreloadReport, JsonHasTheFields) {
  Report& r = Report::get();
  r.setRank(3);
  r.compressed(10, 320);
  r.passed(Verdict::kSmall, 8);
  const std::string j = r.json("onebit");
  for (const char* field :
       {"\"calls_compressed\": 1", "\"calls_passed\": 1", "\"bytes_sent\": 18",
        "\"bytes_full_precision\": 328", "\"codec\": \"onebit\"", "\"rank\": 3", "\"small\": 1"})
    EXPECT_NE(j.find(field), std::string::npos) << field << " in " << j;
}

}  // namespace
}  // namespace squall::preload
