// The interposer's decisions without MPI or NCCL: policy, step placement,
// the residual map, the per-call configs it honours and the report.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <climits>
#include <string>
#include <vector>

#include "plugin/preload/coll_config.h"
#include "plugin/preload/compressors.h"
#include "plugin/preload/nccl_abi.h"
#include "plugin/preload/policy.h"
#include "plugin/preload/report.h"
#include "plugin/preload/residual_map.h"
#include "src/bootstrap/bootstrap.h"
#include "src/core/comm.h"

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
  // A collective left out of SQUALL_PRELOAD_COLLECTIVES, whatever else.
  f.opKnown = true;
  EXPECT_EQ(p.judge(f, Coll::kReduceScatter), Verdict::kCompress);
  p.collectives[static_cast<int>(Coll::kReduceScatter)] = false;
  EXPECT_EQ(p.judge(f, Coll::kReduceScatter), Verdict::kCollective);
  EXPECT_EQ(p.judge(f, Coll::kAllReduce), Verdict::kCompress);
  p.enabled = false;
  EXPECT_EQ(p.judge(f), Verdict::kDisabled);
}

TEST(PreloadPolicy, ReadsTheEnvironment) {
  setenv("SQUALL_PRELOAD_CODEC", "int8:block=256", 1);
  setenv("SQUALL_PRELOAD_DTYPES", "fp32", 1);
  setenv("SQUALL_PRELOAD_OPS", "sum", 1);
  setenv("SQUALL_PRELOAD_RESIDUAL_MB", "3", 1);
  setenv("SQUALL_PRELOAD_COLLECTIVES", "allreduce", 1);
  Policy p = Policy::fromEnvironment();
  EXPECT_TRUE(p.collectives[static_cast<int>(Coll::kAllReduce)]);
  EXPECT_FALSE(p.collectives[static_cast<int>(Coll::kReduceScatter)]);
  EXPECT_EQ(p.codec.codec, codec::CodecId::kInt8);
  EXPECT_EQ(p.codec.block, 256u);
  EXPECT_TRUE(p.dtypes[0]);
  EXPECT_FALSE(p.dtypes[1] || p.dtypes[2]);
  EXPECT_TRUE(p.sum);
  EXPECT_FALSE(p.avg);
  EXPECT_EQ(p.residualCapBytes, size_t{3} << 20);
  setenv("SQUALL_PRELOAD_CODEC", "none", 1);  // not a compression: the default stays
  setenv("SQUALL_PRELOAD_DTYPES", "fp32,int4", 1);
  setenv("SQUALL_PRELOAD_COLLECTIVES", "allreduce,allgather", 1);  // unknown: both
  p = Policy::fromEnvironment();
  EXPECT_TRUE(p.collectives[0] && p.collectives[1]);
  EXPECT_EQ(p.codec.codec, codec::CodecId::kInt4);
  EXPECT_EQ(p.codec.block, 256u);
  EXPECT_TRUE(p.dtypes[0] && p.dtypes[1] && p.dtypes[2]);
  for (const char* v : {"SQUALL_PRELOAD_CODEC", "SQUALL_PRELOAD_DTYPES", "SQUALL_PRELOAD_OPS",
                        "SQUALL_PRELOAD_RESIDUAL_MB", "SQUALL_PRELOAD_COLLECTIVES"})
    unsetenv(v);
}

TEST(PreloadPolicy, TheDefaultCodeIsParamsDefsAndParsesToPolicys) {
  // params.def's default text parses, and a Policy built without the
  // environment holds what reading it unset gives.
  unsetenv("SQUALL_PRELOAD_CODEC");
  const Policy fromNothing = Policy::fromEnvironment();
  const Policy built;
  EXPECT_EQ(fromNothing.codecText, built.codecText);
  EXPECT_EQ(fromNothing.codec.codec, built.codec.codec);
  EXPECT_EQ(fromNothing.codec.block, built.codec.block);
  EXPECT_EQ(fromNothing.codec.scale, built.codec.scale);
  EXPECT_EQ(built.codecText, "int4:block=256");
  EXPECT_EQ(built.codec.codec, codec::CodecId::kInt4);
  EXPECT_EQ(built.codec.block, 256u);
}

TEST(PreloadPolicy, TheGatherCodeFollowsTheCodeOrTheVariable) {
  unsetenv("SQUALL_PRELOAD_CODEC");
  unsetenv("SQUALL_PRELOAD_GATHER_CODEC");
  Policy p = Policy::fromEnvironment();  // auto behind int4: int8
  EXPECT_EQ(p.gather.codec, codec::CodecId::kInt8);
  EXPECT_EQ(specText(p.gather), "int8:block=2048");
  EXPECT_EQ(Policy().gather.codec, codec::CodecId::kInt8);
  EXPECT_EQ(p.minBytes, 8192u);
  EXPECT_EQ(Policy().minBytes, p.minBytes);
  setenv("SQUALL_PRELOAD_CODEC", "onebit", 1);  // auto behind onebit: onebit itself
  p = Policy::fromEnvironment();
  EXPECT_EQ(p.gather.codec, codec::CodecId::kOnebit);
  setenv("SQUALL_PRELOAD_CODEC", "int2", 1);
  setenv("SQUALL_PRELOAD_GATHER_CODEC", "same", 1);
  p = Policy::fromEnvironment();
  EXPECT_EQ(p.gather.codec, codec::CodecId::kInt2);
  setenv("SQUALL_PRELOAD_GATHER_CODEC", "int4:block=64", 1);
  p = Policy::fromEnvironment();
  EXPECT_EQ(p.gather.codec, codec::CodecId::kInt4);
  EXPECT_EQ(p.gather.block, 64u);
  setenv("SQUALL_PRELOAD_GATHER_CODEC", "none", 1);  // not a code: auto, with a warning
  p = Policy::fromEnvironment();
  EXPECT_EQ(p.gather.codec, codec::CodecId::kInt8);
  unsetenv("SQUALL_PRELOAD_CODEC");
  unsetenv("SQUALL_PRELOAD_GATHER_CODEC");
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

// A residual of the fake kind: `owed` values in step order.
struct FakeResidual {
  std::vector<float> owed;
};
struct FakeOps {
  const ResidualKey* key = nullptr;
  Status make(std::unique_ptr<FakeResidual>* out) {
    *out = std::make_unique<FakeResidual>(FakeResidual{std::vector<float>(key->count, 0.0f)});
    return Status::kOk;
  }
  Status drain(FakeResidual& r, float* owed) {
    for (size_t i = 0; i < r.owed.size(); ++i) owed[i] += r.owed[i];
    std::fill(r.owed.begin(), r.owed.end(), 0.0f);
    return Status::kOk;
  }
  Status seed(FakeResidual& r, const float* owed) {
    for (size_t i = 0; i < r.owed.size(); ++i) r.owed[i] += owed[i];
    return Status::kOk;
  }
};

// The entry of [offset, offset + count) of fp32 (4 bytes an element).
FakeResidual* acquireAt(StepResiduals<FakeResidual>& residuals, int64_t offset, size_t count,
                        StepResiduals<FakeResidual>::Outcome* outcome) {
  const ResidualKey key{DataType::kF32, offset, count};
  FakeOps ops{&key};
  EXPECT_EQ(residuals.acquire(key, count * 4, ops, outcome), Status::kOk);
  return outcome->value;
}

// Error feedback survives a change of cut: every element's owed error moves
// to whichever entry covers it next, nothing is counted twice, and entries
// never overlap.
TEST(PreloadResiduals, OwedErrorFollowsTheElementsAcrossCuts) {
  StepResiduals<FakeResidual> residuals(1 << 20);
  auto at = [&](int64_t offset, size_t count, bool* recut = nullptr) {
    StepResiduals<FakeResidual>::Outcome outcome;
    FakeResidual* value = acquireAt(residuals, offset, count, &outcome);
    if (recut != nullptr) *recut = outcome.recut;
    return value;
  };
  // Step of 30 elements cut [0,10) [10,30); each element i owes i.
  FakeResidual* a = at(0, 10);
  FakeResidual* b = at(10, 20);
  for (int i = 0; i < 10; ++i) a->owed[i] = static_cast<float>(i);
  for (int i = 0; i < 20; ++i) b->owed[i] = static_cast<float>(10 + i);
  bool recut = true;
  EXPECT_EQ(at(0, 10, &recut), a);  // the same cut: the same entry
  EXPECT_FALSE(recut);
  // Cut [0,30): both drained into it, each element once.
  FakeResidual* whole = at(0, 30, &recut);
  EXPECT_TRUE(recut);
  EXPECT_EQ(residuals.size(), 1u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(whole->owed[i], static_cast<float>(i)) << i;
  for (float& v : whole->owed) v *= 2;
  // Cut [0,5) [5,30): the first takes its part, the rest waits for the second.
  FakeResidual* head = at(0, 5, &recut);
  EXPECT_TRUE(recut);
  EXPECT_EQ(residuals.pendingElements(DataType::kF32), 25);
  FakeResidual* tail = at(5, 25, &recut);
  EXPECT_TRUE(recut);
  EXPECT_EQ(residuals.pendingElements(DataType::kF32), 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(head->owed[i], 2.0f * i);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(tail->owed[i], 2.0f * (5 + i));
  // Another element type is another step.
  StepResiduals<FakeResidual>::Outcome outcome;
  const ResidualKey half{DataType::kF16, 0, 30};
  FakeOps ops{&half};
  ASSERT_EQ(residuals.acquire(half, 120, ops, &outcome), Status::kOk);
  EXPECT_FALSE(outcome.recut);
  EXPECT_EQ(residuals.size(), 3u);
}

TEST(PreloadResiduals, EvictionDrainsInsteadOfLosing) {
  StepResiduals<FakeResidual> residuals(100);
  auto at = [&](int64_t offset, size_t count, uint64_t* evicted) {
    StepResiduals<FakeResidual>::Outcome outcome;
    FakeResidual* value = acquireAt(residuals, offset, count, &outcome);
    *evicted = outcome.evicted;
    return value;
  };
  uint64_t evicted = 0;
  FakeResidual* a = at(0, 20, &evicted);  // 80 of 100 bytes
  a->owed.assign(20, 1.0f);
  FakeResidual* b = at(20, 10, &evicted);  // 40 more: a is drained and goes
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(evicted, 1u);
  EXPECT_EQ(residuals.pendingElements(DataType::kF32), 20);
  FakeResidual* again = at(0, 20, &evicted);  // b goes; a's error comes back
  EXPECT_EQ(again->owed, std::vector<float>(20, 1.0f));
  EXPECT_EQ(at(0, 26, &evicted), nullptr);  // 104 bytes: over the cap alone
}

TEST(PreloadEdges, RunsKeepSmallTensorsAtFullPrecision) {
  TensorEdges edges;
  // A step like Horovod's fused MLP: b3 10, w3 2560, b2 256, w2 65536.
  edges.add(0, 10);
  edges.add(10, 2560);
  edges.add(2570, 256);
  edges.add(2826, 65536);
  auto runs = edges.runs(0, 68362, 1024);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_TRUE(runs[0].full);
  EXPECT_EQ(runs[0].count, 10u);
  EXPECT_FALSE(runs[1].full);
  EXPECT_EQ(runs[1].offset, 10);
  EXPECT_TRUE(runs[2].full);
  EXPECT_EQ(runs[2].offset, 2570);
  EXPECT_EQ(runs[3].count, 65536u);
  // Adjacent small tensors merge into one run; a call inside one tensor is one run.
  edges.add(68362, 100);
  edges.add(68462, 100);
  runs = edges.runs(68362, 200, 1024);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_TRUE(runs[0].full);
  runs = edges.runs(2826, 65536, 1024);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_FALSE(runs[0].full);
}

TEST(PreloadSteps, TheLearningWindowRevealsItsEdges) {
  StepTracker steps(0, 6);
  // Step of 30 = [10, 20] in one step and [30] in the next, then [10, 20].
  for (size_t n : {10, 20, 30, 10, 20}) steps.place(n);
  ASSERT_TRUE(steps.place(30).agree);
  int64_t proposal[2];
  steps.proposal(proposal);
  ASSERT_EQ(proposal[0], 30);
  TensorEdges edges;
  steps.windowEdges(proposal, &edges);
  const auto runs = edges.runs(0, 30, 15);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_TRUE(runs[0].full);   // the 10 below 15
  EXPECT_FALSE(runs[1].full);  // the 20
}

// An ncclCollConfig_t as NCCL's initializer leaves it (NCCL 2.32).
coll_config::Fields unsetConfig() {
  coll_config::Fields f{};
  f.size = sizeof f;
  f.magic = nccl_config::kMagic;
  f.version = 23203;
  f.minCtas = f.maxCtas = f.nvlsCtas = f.clusterSize = f.ctaPolicy = INT_MIN;
  f.algorithmsRequired = 1;
  return f;
}

TEST(PreloadCollConfig, OnlyNoConfigOrNcclsDefaultsAreHonoured) {
  EXPECT_EQ(collConfigIssue(nullptr), CollConfigIssue::kNone);
  coll_config::Fields f = unsetConfig();
  EXPECT_EQ(collConfigIssue(&f), CollConfigIssue::kNone);
  f.algorithms = "";         // an empty filter is none
  f.algorithmsRequired = 0;  // and says nothing without a filter
  EXPECT_EQ(collConfigIssue(&f), CollConfigIssue::kNone);
  int option = 0;
  const auto with = [&](auto set) {
    coll_config::Fields g = unsetConfig();
    set(g);
    return collConfigIssue(&g);
  };
  EXPECT_EQ(with([](auto& g) { g.magic = 0; }), CollConfigIssue::kMagic);
  EXPECT_EQ(with([](auto& g) { g.size = sizeof g + 8; }), CollConfigIssue::kSize);
  EXPECT_EQ(with([](auto& g) { g.size = sizeof g - 8; }), CollConfigIssue::kSize);
  EXPECT_EQ(with([&](auto& g) { g.vendorOptions = &option; }), CollConfigIssue::kVendorOptions);
  EXPECT_EQ(with([](auto& g) { g.minCtas = 1; }), CollConfigIssue::kMinCtas);
  EXPECT_EQ(with([](auto& g) { g.maxCtas = 0; }), CollConfigIssue::kMaxCtas);
  EXPECT_EQ(with([](auto& g) { g.nvlsCtas = 2; }), CollConfigIssue::kNvlsCtas);
  EXPECT_EQ(with([](auto& g) { g.clusterSize = 2; }), CollConfigIssue::kClusterSize);
  EXPECT_EQ(with([](auto& g) { g.algorithms = "ring"; }), CollConfigIssue::kAlgorithms);
  EXPECT_EQ(with([](auto& g) { g.ctaPolicy = 0; }), CollConfigIssue::kCtaPolicy);
  EXPECT_EQ(with([](auto& g) { g.profilerTag = 1; }), CollConfigIssue::kProfilerTag);
  EXPECT_EQ(with([&](auto& g) { g.launchedEvent = &option; }), CollConfigIssue::kLaunchedEvent);
  EXPECT_STREQ(collConfigIssueName(CollConfigIssue::kAlgorithms), "algSelection");
  // A head of another size is not read past.
  struct {
    size_t size;
    unsigned magic, version;
  } head{16, nccl_config::kMagic, 23203};
  EXPECT_EQ(collConfigIssue(&head), CollConfigIssue::kSize);
}

TEST(PreloadReport, JsonHasTheFields) {
  Report& r = Report::get();
  r.setRank(3);
  r.compressed(codec::CodecId::kInt2, 10, 320);
  r.compressed(codec::CodecId::kInt4, 20, 320);
  r.passed(Verdict::kSmall, 8);
  r.recut();
  r.keptFull(256);
  const std::string j = r.json("onebit", "int8:block=2048");
  for (const char* field :
       {"\"gather_codec\": \"int8:block=2048\"", "\"calls_compressed\": 2", "\"calls_passed\": 1",
        "\"bytes_sent\": 38", "\"bytes_full_precision\": 648", "\"codec\": \"onebit\"",
        "\"rank\": 3", "\"small\": 1", "\"calls_recut\": 1", "\"elements_kept_full\": 256",
        "\"calls_by_codec\": {\"onebit\": 0, \"fp16\": 0, \"bf16\": 0, \"int8\": 0, \"int2\": 1, "
        "\"int4\": 1}",
        "\"bytes_by_codec\": {\"onebit\": 0, \"fp16\": 0, \"bf16\": 0, \"int8\": 0, \"int2\": 10, "
        "\"int4\": 20}",
        "\"bytes_full_precision_by_codec\": {\"onebit\": 0, \"fp16\": 0, \"bf16\": 0, \"int8\": 0, "
        "\"int2\": 320, \"int4\": 320}"})
    EXPECT_NE(j.find(field), std::string::npos) << field << " in " << j;
  // A call passed for its ncclCollConfig_t counts under coll_config, and by
  // what the config set.
  r.passedForConfig(CollConfigIssue::kAlgorithms, 8);
  const std::string k = r.json("onebit");
  for (const char* field : {"\"calls_passed\": 2", "\"coll_config\": 1",
                            "\"coll_config_passed\": {\"magic\": 0, \"size\": 0, \"ext\": 0, "
                            "\"minCTAs\": 0, \"maxCTAs\": 0, \"nvlsCTAs\": 0, "
                            "\"cgaClusterSize\": 0, \"algSelection\": 1, \"CTAPolicy\": 0, "
                            "\"userProfilerTag\": 0, \"launchCompletionEvent\": 0}"})
    EXPECT_NE(k.find(field), std::string::npos) << field << " in " << k;
  // Each collective's calls and bytes apart; the totals hold both.
  r.compressed(codec::CodecId::kInt4, 5, 64, Coll::kReduceScatter);
  r.passed(Verdict::kOp, 16, Coll::kReduceScatter);
  const std::string m = r.json("int4");
  for (const char* field :
       {"\"calls_compressed\": 3", "\"calls_passed\": 3",
        "\"allreduce\": {\"calls_compressed\": 2, \"calls_passed\": 2, \"bytes_sent\": 46, "
        "\"bytes_full_precision\": 656}",
        "\"reduce_scatter\": {\"calls_compressed\": 1, \"calls_passed\": 1, \"bytes_sent\": 21, "
        "\"bytes_full_precision\": 80}"})
    EXPECT_NE(m.find(field), std::string::npos) << field << " in " << m;
}

// A fused step of four tensors, 10, 500, 20 and 470 elements, the step
// given; minBytes 64 makes 16 fp32 or 32 bf16 elements small.
Policy cutPolicy() {
  Policy p;
  p.stepElements = 1000;
  p.minBytes = 64;
  return p;
}

TEST(PreloadCut, TheStepStateLearnsEdgesAndCutsByElementSize) {
  const Policy p = cutPolicy();
  StepState state(p);
  for (size_t n : {10, 500, 20, 470}) EXPECT_TRUE(state.place(n).known);
  // fp32: only the 10 is small; the 20 joins the runs around it.
  auto runs = cutRuns(state, p, CutCall{DataType::kF32, 0, 1000, 2, ReduceOp::kSum, nullptr});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_TRUE(runs[0].full);
  EXPECT_EQ(runs[1].offset, 10);
  EXPECT_EQ(runs[1].count, 990u);
  // bf16: the 20 is small too.
  runs = cutRuns(state, p, CutCall{DataType::kBf16, 0, 1000, 2, ReduceOp::kSum, nullptr});
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_TRUE(runs[2].full);
  EXPECT_EQ(runs[2].offset, 510);
  EXPECT_EQ(runs[3].count, 470u);
  // A call that crosses the step's end proves it wrong: edges and residuals go.
  EXPECT_TRUE(state.place(600).known);
  EXPECT_TRUE(state.place(600).relearn);
  EXPECT_EQ(state.edges.size(), 0u);
}

uint64_t keptFullSoFar() {
  const std::string j = Report::get().json("int4");
  const std::string field = "\"elements_kept_full\": ";
  return std::stoull(j.substr(j.find(field) + field.size()));
}

TEST(PreloadCut, EachRunGoesWhereItLiesAndTheFirstFailureEndsTheCall) {
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  core::CommConfig config;
  config.transport = core::TransportKind::kTcp;
  std::unique_ptr<core::Comm> engine;
  ASSERT_EQ(core::Comm::create(id, 1, 0, config, &engine), Status::kOk) << lastError();
  const Policy p = cutPolicy();
  StepState state(p);
  for (size_t n : {10, 500, 20, 470}) state.place(n);
  const CutCall call{DataType::kBf16, 0, 1000, 1, ReduceOp::kSum, nullptr};
  const auto runs = cutRuns(state, p, call);

  using Pieces = std::vector<std::pair<size_t, size_t>>;  // (skip, count)
  struct Front {
    Pieces sentFull, sentCompressed;
    int failAt = -1;  // the compressed piece that fails, with 7
    int full(size_t skip, size_t n) {
      sentFull.emplace_back(skip, n);
      return 0;
    }
    int compressed(size_t skip, core::Compressor& c) {
      sentCompressed.emplace_back(skip, c.count());
      return static_cast<int>(sentCompressed.size()) - 1 == failAt ? 7 : 0;
    }
    static int failed(Status) { return 9; }
  } front;
  const uint64_t keptBefore = keptFullSoFar();
  uint64_t sent = 1;
  ASSERT_EQ(runCut(state, *engine, p, call, runs, front, &sent), 0);
  EXPECT_EQ(sent, 0u);  // one rank sends nothing
  EXPECT_EQ(front.sentFull, (Pieces{{0, 10}, {510, 20}}));
  EXPECT_EQ(front.sentCompressed, (Pieces{{10, 500}, {530, 470}}));
  EXPECT_EQ(keptFullSoFar() - keptBefore, 30u);
  // Each compressed run has a residual of its own, found again next step.
  EXPECT_EQ(state.residuals.size(), 2u);
  ASSERT_EQ(runCut(state, *engine, p, call, runs, front, &sent), 0);
  EXPECT_EQ(state.residuals.size(), 2u);

  // The first failure ends the call: nothing after it is sent.
  Front failing;
  failing.failAt = 0;
  EXPECT_EQ(runCut(state, *engine, p, call, runs, failing, &sent), 7);
  EXPECT_EQ(failing.sentFull, (Pieces{{0, 10}}));
  EXPECT_EQ(failing.sentCompressed, (Pieces{{10, 500}}));
}

}  // namespace
}  // namespace squall::preload
