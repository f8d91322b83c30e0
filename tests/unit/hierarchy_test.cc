// The hierarchical compressed allreduce: ranks as processes over TCP on
// loopback (SQUALL_SOCKET_IFNAME=lo), hosts emulated by SQUALL_HOSTID per
// rank, so the ranks of one "host" share a real POSIX shared-memory segment.
// Each rank writes what it saw to a file; the parent compares the ranks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/codec/numeric.h"
#include "src/common/status.h"
#include "src/core/comm.h"

namespace squall::core {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;
using Body = std::function<std::string(Comm&, int rank)>;

TransportKind gTransport = TransportKind::kTcp;

CommConfig tcpConfig(int timeoutSeconds) {
  CommConfig c;
  c.transport = gTransport;
  c.timeout = std::chrono::seconds(timeoutSeconds);
  return c;
}

// Named by the parent's pid, which the children learn before they fork.
std::string outputPath(pid_t parent, int rank) {
  return "/tmp/squall_hierarchy_test." + std::to_string(parent) + "." + std::to_string(rank);
}

// Runs body on n forked ranks; envOf(rank) is set in each before the
// communicator is created. Returns each rank's report ("ERROR: ..." when the
// rank failed; "KILLED" when it ran past 50 s).
std::vector<std::string> runRanks(int n, const std::function<Env(int)>& envOf, const Body& body,
                                  int timeoutSeconds = 20) {
  bootstrap::UniqueId id;
  EXPECT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  std::vector<pid_t> pids;
  const pid_t parent = getpid();
  auto outputPath = [parent](int rank) { return core::outputPath(parent, rank); };
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(55);
      for (const auto& [k, v] : envOf(r)) setenv(k.c_str(), v.c_str(), 1);
      std::string report;
      std::unique_ptr<Comm> comm;
      if (Comm::create(id, n, r, tcpConfig(timeoutSeconds), &comm) != Status::kOk) {
        report = "ERROR: create: " + lastError();
      } else {
        report = body(*comm, r);
        (void)comm->barrier();
      }
      std::ofstream(outputPath(r), std::ios::binary) << report;
      comm.reset();
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> reports(static_cast<size_t>(n));
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(50);
  for (int r = 0; r < n; ++r) {
    int status = 0;
    while (waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > limit) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[static_cast<size_t>(r)], &status, 0);
        reports[static_cast<size_t>(r)] = "KILLED";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!reports[static_cast<size_t>(r)].empty()) continue;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      reports[static_cast<size_t>(r)] =
          "ERROR: the rank ended with status " + std::to_string(status) + " (signal " +
          std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : 0) + ")";
      std::remove(outputPath(r).c_str());
      continue;
    }
    std::ifstream in(outputPath(r), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    reports[static_cast<size_t>(r)] = text.str();
    std::remove(outputPath(r).c_str());
  }
  return reports;
}

// Ranks r*L .. r*L + L-1 on host r (or `hostOf` when given).
std::function<Env(int)> hosts(int local, const Env& extra = {}) {
  return [=](int r) {
    Env e = extra;
    e.emplace_back("SQUALL_HOSTID", "host" + std::to_string(r / local));
    return e;
  };
}

float inputValue(int rank, size_t i, int call) {
  // Distinct magnitudes per rank and element, signs mixed, changing per call.
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank) +
                  0.11f * static_cast<float>(call)) *
         (1.0f + 0.25f * static_cast<float>(rank));
}

void fill(DataType dtype, std::vector<uint8_t>* buffer, size_t count, int rank, int call) {
  buffer->resize(count * dataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float v = inputValue(rank, i, call);
    if (dtype == DataType::kF32) {
      std::memcpy(buffer->data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DataType::kF16 ? codec::floatToHalf(v) : codec::floatToBf16(v);
      std::memcpy(buffer->data() + 2 * i, &h, 2);
    }
  }
}

float valueAt(DataType dtype, const std::vector<uint8_t>& buffer, size_t i) {
  if (dtype == DataType::kF32) {
    float v;
    std::memcpy(&v, buffer.data() + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, buffer.data() + 2 * i, 2);
  return dtype == DataType::kF16 ? codec::halfToFloat(h) : codec::bf16ToFloat(h);
}

// The exact result over n ranks of the rounded inputs.
std::vector<double> exact(DataType dtype, ReduceOp op, size_t count, int n, int call) {
  std::vector<double> sum(count, 0.0);
  std::vector<uint8_t> b;
  for (int r = 0; r < n; ++r) {
    fill(dtype, &b, count, r, call);
    for (size_t i = 0; i < count; ++i) sum[i] += valueAt(dtype, b, i);
  }
  if (op == ReduceOp::kAvg)
    for (double& v : sum) v /= n;
  return sum;
}

double relativeError(DataType dtype, const std::vector<uint8_t>& out,
                     const std::vector<double>& x) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = valueAt(dtype, out, i) - x[i];
    err += d * d;
    norm += x[i] * x[i];
  }
  return norm == 0 ? 0 : std::sqrt(err / norm);
}

const char* dtypeTag(DataType d) {
  return d == DataType::kF32 ? "f32" : d == DataType::kF16 ? "f16" : "bf16";
}

// Every case: the output bytes (hex-free: raw) and the algorithm, so the
// parent can compare ranks byte for byte; plus the relative error.
std::string sweepWith(Comm& comm, int rank, const codec::Spec& spec) {
  std::string report;
  const int n = comm.size();
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBf16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t count : {size_t{1}, size_t{5}, size_t{2048 * 3 + 7}, size_t{70001}}) {
        for (bool inPlace : {false, true}) {
          std::unique_ptr<Compressor> c;
          if (comm.createCompressor(count, spec, &c) != Status::kOk)
            return "ERROR: createCompressor: " + lastError();
          std::vector<uint8_t> in, out;
          fill(dtype, &in, count, rank, 0);
          out.assign(in.size(), 0);
          void* dst = inPlace ? in.data() : out.data();
          if (comm.compressedAllReduce(in.data(), dst, dtype, op, *c) != Status::kOk)
            return "ERROR: compressedAllReduce: " + lastError();
          const std::vector<uint8_t>& result = inPlace ? in : out;
          CompressorStats s;
          (void)c->stats(&s);
          const double err = relativeError(dtype, result, exact(dtype, op, count, n, 0));
          char line[200];
          std::snprintf(line, sizeof(line), "%s %s %zu %d %s err=%.3f|", dtypeTag(dtype),
                        op == ReduceOp::kSum ? "sum" : "avg", count, inPlace ? 1 : 0, s.algorithm,
                        err);
          report += line;
          report.append(reinterpret_cast<const char*>(result.data()), result.size());
          report += "\n";
        }
      }
    }
  }
  return report;
}

std::string sweep(Comm& comm, int rank) { return sweepWith(comm, rank, codec::Spec{}); }

// Without a codec the hierarchy is exact up to fp32 summation order (the
// host sums first): the plumbing (slices, rounds, conversions) is tested
// apart from the codec's error.
std::string sweepExact(Comm& comm, int rank) {
  codec::Spec none;
  none.codec = codec::CodecId::kNone;
  return sweepWith(comm, rank, none);
}

void expectIdenticalHierarchical(const std::vector<std::string>& reports, double bound) {
  ASSERT_FALSE(reports.empty());
  for (size_t r = 0; r < reports.size(); ++r) {
    ASSERT_EQ(reports[r].rfind("ERROR", 0), std::string::npos)
        << "rank " << r << ": " << reports[r];
    ASSERT_NE(reports[r], "KILLED") << "rank " << r;
    EXPECT_TRUE(reports[r] == reports[0]) << "rank " << r << " differs from rank 0";
  }
  // Every case ran hierarchically, with an error within the bound: for
  // onebit one call keeps the direction but little detail (the exchange
  // among hosts compresses twice; zeros or garbage give 1 or more); without
  // a codec it is rounding only.
  std::istringstream lines(reports[0]);
  std::string header;
  int cases = 0;
  size_t at = 0;
  while ((at = reports[0].find("err=", at)) != std::string::npos) {
    const size_t begin = reports[0].rfind('\n', at);
    header =
        reports[0].substr(begin == std::string::npos ? 0 : begin + 1,
                          reports[0].find('|', at) - (begin == std::string::npos ? 0 : begin + 1));
    EXPECT_NE(header.find("hierarchical"), std::string::npos) << header;
    const double err = std::atof(reports[0].c_str() + at + 4);
    EXPECT_LT(err, bound) << header;
    ++cases;
    ++at;
  }
  EXPECT_EQ(cases, 3 * 2 * 4 * 2) << reports[0].substr(0, 300);
}

TEST(Hierarchy, TwoHostsOfTwoAreBitIdentical) {
  expectIdenticalHierarchical(runRanks(4, hosts(2), sweep), 0.99);
}

TEST(Hierarchy, TwoHostsOfTwoWithoutCodecAreExact) {
  // fp16/bf16 outputs round once: 2^-8 relative at worst for bf16.
  expectIdenticalHierarchical(runRanks(4, hosts(2), sweepExact), 0.005);
}

TEST(Hierarchy, TwoHostsOfThreeAreBitIdentical) {
  // A small window: every buffer above 1 KiB takes several rounds.
  expectIdenticalHierarchical(runRanks(6, hosts(3, {{"SQUALL_SHM_WINDOW_BYTES", "4096"}}), sweep),
                              0.99);
}

#ifdef SQUALL_HAVE_UCX
// The same over UCX (its own shared-memory and loopback transports carry the
// notes and the exchange).
TEST(Hierarchy, TwoHostsOfTwoOverUcx) {
  gTransport = TransportKind::kUcx;
  expectIdenticalHierarchical(runRanks(4, hosts(2), sweepExact), 0.005);
  gTransport = TransportKind::kTcp;
}
#endif

TEST(Hierarchy, ThreeHostsOfTwoAreBitIdentical) {
  expectIdenticalHierarchical(runRanks(6, hosts(2), sweep), 0.99);
}

// The local phases run inside the exchange among hosts (its hooks), window by
// window as it needs its input and decodes its output. With one-block
// segments and small windows every buffer above a few blocks takes many of
// each, interleaved (12 KiB windows: 1.5 segments of fp32, so windows and
// segments end at different places); without segments the exchange asks for
// its whole input at once and hands back its whole output, the phases one
// after the other. The bytes must not depend on how they interleave.
void expectPipeliningKeepsTheBytes(int ranks, int local, const Env& extra, double bound = 0.99) {
  Env sequential = extra, pipelined = extra;
  sequential.emplace_back("SQUALL_SEGMENT_BYTES", "0");
  pipelined.emplace_back("SQUALL_SEGMENT_BYTES", "8192");
  for (Env* e : {&sequential, &pipelined}) e->emplace_back("SQUALL_SHM_WINDOW_BYTES", "12288");
  const std::vector<std::string> one = runRanks(ranks, hosts(local, sequential), sweep);
  const std::vector<std::string> two = runRanks(ranks, hosts(local, pipelined), sweep);
  expectIdenticalHierarchical(one, bound);
  expectIdenticalHierarchical(two, bound);
  EXPECT_TRUE(one[0] == two[0]) << "pipelined and sequential outputs differ";
}

TEST(Hierarchy, PipelinedAllGatherExchangeKeepsTheBytes) {
  expectPipeliningKeepsTheBytes(4, 2, {});
}

TEST(Hierarchy, PipelinedUnevenSlicesKeepTheBytes) {
  // 3 slices per host: the last ones are a group of blocks shorter, so a
  // rank finishes its own slice while its peers still need its rounds.
  expectPipeliningKeepsTheBytes(6, 3, {});
}

TEST(Hierarchy, PipelinedTwoPhaseExchangeKeepsTheBytes) {
  // Among 3 hosts the two-phase compresses twice more than the host sum:
  // one call's error is about 1.03 on this input.
  expectPipeliningKeepsTheBytes(6, 2, {{"SQUALL_COMPRESSED_ALGO", "twophase"}}, 1.2);
}

// Without error feedback the hierarchy keeps no residual: each call's bytes
// are those of a compressor with feedback reset before that call, pipelined
// or not, whichever exchange runs among the hosts.
std::string withoutFeedback(Comm& comm, int rank) {
  std::string report;
  for (size_t count : {size_t{2048 * 3 + 7}, size_t{70001}}) {
    std::unique_ptr<Compressor> kept, none;
    if (comm.createCompressor(count, codec::Spec{}, &kept) != Status::kOk ||
        comm.createCompressor(count, codec::Spec{}, &none, 0, coll::Feedback::kNone) != Status::kOk)
      return "ERROR: createCompressor: " + lastError();
    for (int call = 0; call < 3; ++call) {
      std::vector<uint8_t> in, fresh(count * 4), stateless(count * 4);
      fill(DataType::kF32, &in, count, rank, call);
      if (kept->reset() != Status::kOk ||
          comm.compressedAllReduce(in.data(), fresh.data(), DataType::kF32, ReduceOp::kAvg,
                                   *kept) != Status::kOk ||
          comm.compressedAllReduce(in.data(), stateless.data(), DataType::kF32, ReduceOp::kAvg,
                                   *none) != Status::kOk)
        return "ERROR: compressedAllReduce: " + lastError();
      CompressorStats s;
      (void)none->stats(&s);
      report += std::string(s.algorithm) + (fresh == stateless ? " same" : " differs") + "|";
    }
  }
  return report;
}

TEST(Hierarchy, WithoutFeedbackEveryCallIsAFreshCompressorsCall) {
  const std::string want = [] {
    std::string w;
    for (int i = 0; i < 6; ++i) w += "hierarchical same|";
    return w;
  }();
  for (const char* algo : {"twophase", "allgather"}) {
    for (const char* segment : {"0", "8192"}) {
      const std::vector<std::string> reports =
          runRanks(4,
                   hosts(2, {{"SQUALL_COMPRESSED_ALGO", algo},
                             {"SQUALL_SEGMENT_BYTES", segment},
                             {"SQUALL_SHM_WINDOW_BYTES", "12288"}}),
                   withoutFeedback);
      for (size_t r = 0; r < reports.size(); ++r)
        EXPECT_EQ(reports[r], want) << algo << " segment " << segment << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace squall::core

namespace squall::core {
namespace {

// The same input every call: with error feedback the mean of the outputs
// approaches the exact result (the residuals carry what each call lost).
std::string feedback(Comm& comm, int rank) {
  const size_t count = 20000;
  const int calls = 40;
  std::unique_ptr<Compressor> c;
  if (comm.createCompressor(count, codec::Spec{}, &c) != Status::kOk)
    return "ERROR: createCompressor: " + lastError();
  std::vector<uint8_t> in, out(count * 4);
  fill(DataType::kF32, &in, count, rank, 0);
  const std::vector<double> x = exact(DataType::kF32, ReduceOp::kSum, count, comm.size(), 0);
  std::vector<double> mean(count, 0.0);
  double first = 0;
  for (int call = 0; call < calls; ++call) {
    if (comm.compressedAllReduce(in.data(), out.data(), DataType::kF32, ReduceOp::kSum, *c) !=
        Status::kOk)
      return "ERROR: compressedAllReduce: " + lastError();
    if (call == 0) first = relativeError(DataType::kF32, out, x);
    for (size_t i = 0; i < count; ++i) mean[i] += valueAt(DataType::kF32, out, i) / calls;
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    err += (mean[i] - x[i]) * (mean[i] - x[i]);
    norm += x[i] * x[i];
  }
  CompressorStats s;
  (void)c->stats(&s);
  char line[160];
  std::snprintf(line, sizeof(line), "%s %.4f %.4f", s.algorithm, first, std::sqrt(err / norm));
  return line;
}

TEST(Hierarchy, ErrorFeedbackConvergesLikeTheFlatAlgorithm) {
  const Env twophase{{"SQUALL_COMPRESSED_ALGO", "twophase"}};
  Env off = twophase;
  off.emplace_back("SQUALL_HIERARCHY", "off");
  const std::vector<std::string> hier = runRanks(4, hosts(2, twophase), feedback);
  const std::vector<std::string> flat = runRanks(4, hosts(2, off), feedback);
  char algo[32], flatAlgo[32];
  double first = 1, mean = 1, flatFirst = 1, flatMean = 1;
  ASSERT_EQ(std::sscanf(hier[0].c_str(), "%31s %lf %lf", algo, &first, &mean), 3) << hier[0];
  ASSERT_EQ(std::sscanf(flat[0].c_str(), "%31s %lf %lf", flatAlgo, &flatFirst, &flatMean), 3)
      << flat[0];
  for (size_t r = 1; r < hier.size(); ++r) EXPECT_EQ(hier[r], hier[0]) << "rank " << r;
  EXPECT_STREQ(algo, "hierarchical");
  EXPECT_STREQ(flatAlgo, "twophase");
  std::printf("hierarchical: first call %.4f, mean of 40 %.4f; flat: %.4f, %.4f\n", first, mean,
              flatFirst, flatMean);
  // Without the residuals the mean of identical calls would stay at the
  // first call's error.
  EXPECT_LT(mean, first / 5);
  EXPECT_LT(mean, 2 * flatMean + 0.01);
}

// A NaN on one rank: every rank's output shows it, no rank commits, and the
// next call gives exactly what it gives after a run without the NaN call.
std::string nonFinite(Comm& comm, int rank) {
  const size_t count = 5000;
  std::unique_ptr<Compressor> with, without;
  if (comm.createCompressor(count, codec::Spec{}, &with) != Status::kOk ||
      comm.createCompressor(count, codec::Spec{}, &without) != Status::kOk)
    return "ERROR: createCompressor: " + lastError();
  std::vector<uint8_t> x0, x1, bad, out(count * 4), outWith(count * 4), outWithout(count * 4);
  fill(DataType::kF32, &x0, count, rank, 0);
  fill(DataType::kF32, &x1, count, rank, 1);
  bad = x0;
  if (rank == 3) {
    const float nan = std::nanf("");
    std::memcpy(bad.data() + size_t{4} * 4321, &nan, 4);
  }
  auto call = [&](Compressor& c, std::vector<uint8_t>& in, std::vector<uint8_t>& o) {
    return comm.compressedAllReduce(in.data(), o.data(), DataType::kF32, ReduceOp::kSum, c);
  };
  if (call(*with, x0, out) != Status::kOk || call(*without, x0, out) != Status::kOk ||
      call(*with, bad, out) != Status::kOk)
    return "ERROR: compressedAllReduce: " + lastError();
  bool sawNan = false;
  for (size_t i = 0; i < count; ++i) sawNan = sawNan || std::isnan(valueAt(DataType::kF32, out, i));
  if (call(*with, x1, outWith) != Status::kOk || call(*without, x1, outWithout) != Status::kOk)
    return "ERROR: compressedAllReduce: " + lastError();
  CompressorStats s;
  (void)with->stats(&s);
  std::string report = std::string(s.algorithm) + " nan=" + (sawNan ? "1" : "0") +
                       " skipped=" + std::to_string(s.skippedCalls) +
                       " same=" + (outWith == outWithout ? "1" : "0");
  return report;
}

TEST(Hierarchy, NonFiniteInputOnOneRankCommitsNowhere) {
  for (const char* algo : {"twophase", "allgather"}) {
    const std::vector<std::string> reports =
        runRanks(4, hosts(2, {{"SQUALL_COMPRESSED_ALGO", algo}}), nonFinite);
    for (size_t r = 0; r < reports.size(); ++r)
      EXPECT_EQ(reports[r], "hierarchical nan=1 skipped=1 same=1") << algo << " rank " << r;
  }
}

// The exchange among hosts takes the compressor's second-round code
// (setGatherSpec reaches the cross-host state): int4 with int8 gathers lands
// nearer the exact mean than int4 both ways, call after call, for the cross
// bytes of (hosts-1)/hosts x (int4 + int8) instead of 2 x int4. The report
// is the same on every rank (outputs and errors); a rank that sees the wider
// round change nothing, or cost nothing, says so.
std::string gatherCode(Comm& comm, int rank) {
  codec::Spec int4, int8;
  int4.codec = codec::CodecId::kInt4;
  int4.block = 256;
  int8.codec = codec::CodecId::kInt8;
  const size_t count = 70001;
  std::string report;
  double err[2] = {0, 0};
  uint64_t cross[2] = {0, 0};
  for (int wide = 0; wide < 2; ++wide) {
    std::unique_ptr<Compressor> c;
    if (comm.createCompressor(count, int4, &c) != Status::kOk)
      return "ERROR: createCompressor: " + lastError();
    if (c->setAlgorithm(coll::CompressedAlgo::kTwoPhase) != Status::kOk ||
        (wide != 0 && c->setGatherSpec(int8) != Status::kOk))
      return "ERROR: setAlgorithm/setGatherSpec: " + lastError();
    std::vector<uint8_t> in, out(count * 4);
    for (int call = 0; call < 3; ++call) {
      fill(DataType::kF32, &in, count, rank, call);
      if (comm.compressedAllReduce(in.data(), out.data(), DataType::kF32, ReduceOp::kAvg, *c) !=
          Status::kOk)
        return "ERROR: compressedAllReduce: " + lastError();
      err[wide] += relativeError(DataType::kF32, out,
                                 exact(DataType::kF32, ReduceOp::kAvg, count, comm.size(), call));
    }
    CompressorStats s;
    (void)c->stats(&s);
    if (std::string(s.algorithm) != "hierarchical") return "ERROR: ran " + std::string(s.algorithm);
    cross[wide] = s.crossBytesSent;
    char line[100];
    std::snprintf(line, sizeof(line), "gather=%s err=%.6f|", wide != 0 ? "int8" : "int4",
                  err[wide]);
    report += line;
    report.append(reinterpret_cast<const char*>(out.data()), out.size());
    report += "\n";
  }
  if (!(err[1] < 0.9 * err[0]))
    return "ERROR: the int8 round did not bring the mean nearer: " + std::to_string(err[1]) +
           " against " + std::to_string(err[0]);
  if (cross[0] != 0 && !(cross[1] > cross[0]))
    return "ERROR: the int8 round sent no more: " + std::to_string(cross[1]) + " against " +
           std::to_string(cross[0]);
  return report;
}

TEST(Hierarchy, TheSecondRoundCodeReachesTheExchangeAmongHosts) {
  const std::vector<std::string> reports = runRanks(6, hosts(2), gatherCode);
  for (size_t r = 0; r < reports.size(); ++r) {
    ASSERT_EQ(reports[r].rfind("ERROR", 0), std::string::npos)
        << "rank " << r << ": " << reports[r];
    ASSERT_NE(reports[r], "KILLED") << "rank " << r;
    EXPECT_TRUE(reports[r] == reports[0]) << "rank " << r << " differs from rank 0";
  }
}

// Which algorithm ran, and whether its result is right (no codec, so
// "right" is exact up to rounding).
std::string algorithmOnly(Comm& comm, int rank) {
  const size_t count = 3000;
  std::unique_ptr<Compressor> c;
  codec::Spec none;
  none.codec = codec::CodecId::kNone;
  if (comm.createCompressor(count, none, &c) != Status::kOk)
    return "ERROR: createCompressor: " + lastError();
  std::vector<uint8_t> in, out(count * 4);
  fill(DataType::kF32, &in, count, rank, 0);
  if (comm.compressedAllReduce(in.data(), out.data(), DataType::kF32, ReduceOp::kSum, *c) !=
      Status::kOk)
    return "ERROR: compressedAllReduce: " + lastError();
  CompressorStats s;
  (void)c->stats(&s);
  return std::string(s.algorithm) + " " +
         std::to_string(
             relativeError(DataType::kF32, out,
                           exact(DataType::kF32, ReduceOp::kSum, count, comm.size(), 0)) < 1e-6);
}

void expectEverywhere(const std::vector<std::string>& reports, const std::string& want,
                      const char* what) {
  for (size_t r = 0; r < reports.size(); ++r) EXPECT_EQ(reports[r], want) << what << " rank " << r;
}

TEST(Hierarchy, FallsBackToFlat) {
  const Env twophase{{"SQUALL_COMPRESSED_ALGO", "twophase"}};
  // Hosts of 2, 1 and 2 ranks... hosts(2) with 5 ranks: 2, 2, 1.
  expectEverywhere(runRanks(5, hosts(2, twophase), algorithmOnly), "twophase 1", "irregular");
  // One rank per host, and one host of four.
  expectEverywhere(runRanks(3, hosts(1, twophase), algorithmOnly), "twophase 1", "one per host");
  expectEverywhere(runRanks(4, hosts(4, twophase), algorithmOnly), "twophase 1", "one host");
  Env off = twophase;
  off.emplace_back("SQUALL_HIERARCHY", "off");
  expectEverywhere(runRanks(4, hosts(2, off), algorithmOnly), "twophase 1", "off");
  // Only rank 2 says off: all ranks agree on flat all the same.
  auto oneOff = [&](int r) {
    Env e = hosts(2, twophase)(r);
    if (r == 2) e.emplace_back("SQUALL_HIERARCHY", "off");
    return e;
  };
  expectEverywhere(runRanks(4, oneOff, algorithmOnly), "twophase 1", "off on one rank");
  // And the control: the same job with the hierarchy on.
  expectEverywhere(runRanks(4, hosts(2, twophase), algorithmOnly), "hierarchical 1", "control");
}

// Slices are whole groups of H codec blocks, the first ones one group larger:
// 10000 elements on 2 hosts of 2 with block 2048 are 3 groups of 4096, so
// local index 0 owns [0, 8192) and index 1 [8192, 10000).
std::string layout(Comm& comm, int) {
  std::unique_ptr<Compressor> c;
  if (comm.createCompressor(10000, codec::Spec{}, &c) != Status::kOk)
    return "ERROR: createCompressor: " + lastError();
  CompressorStats s;
  (void)c->stats(&s);
  return std::to_string(s.hosts) + " " + std::to_string(s.ranksPerHost) + " " +
         std::to_string(s.sliceBegin) + " " + std::to_string(s.sliceCount);
}

TEST(Hierarchy, CompressorReportsItsSlice) {
  const std::vector<std::string> reports = runRanks(4, hosts(2), layout);
  const char* want[] = {"2 2 0 8192", "2 2 8192 1808", "2 2 0 8192", "2 2 8192 1808"};
  for (size_t r = 0; r < reports.size(); ++r) EXPECT_EQ(reports[r], want[r]) << "rank " << r;
  expectEverywhere(runRanks(4, hosts(2, {{"SQUALL_HIERARCHY", "off"}}), layout), "0 1 0 10000",
                   "flat");
}

TEST(Hierarchy, SharedMemoryFailureOnOneRankFallsBackEverywhere) {
  const Env twophase{{"SQUALL_COMPRESSED_ALGO", "twophase"}};
  // Rank 3 cannot open its host's segment; rank 0 cannot create its own.
  for (const char* failing : {"3", "0"}) {
    Env e = twophase;
    e.emplace_back("SQUALL_SHM_FAIL_RANKS", failing);
    expectEverywhere(runRanks(4, hosts(2, e), algorithmOnly), "twophase 1", failing);
  }
}

}  // namespace
}  // namespace squall::core

namespace squall::core {
namespace {

std::string blobPath(int rank) {
  return "/tmp/squall_hierarchy_blob." + std::to_string(getppid()) + "." + std::to_string(rank);
}

// APMSqueeze past its warmup: the compressed stage's residuals (both levels)
// are in the state.
Status trainedOptimizer(Comm& comm, int rank, std::unique_ptr<Optimizer>* o,
                        std::vector<float>* params) {
  optim::Config config;
  config.warmupSteps = 2;
  const size_t count = 9000;
  SQUALL_TRY(comm.createOptimizer(count, config, o));
  params->assign(count, 0.5f);
  std::vector<float> g(count);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < count; ++i) g[i] = inputValue(rank, i, step);
    SQUALL_TRY((*o)->step(params->data(), g.data(), 0.01f));
  }
  return Status::kOk;
}

std::string saveBlob(Comm& comm, int rank) {
  std::unique_ptr<Optimizer> o;
  std::vector<float> params;
  if (trainedOptimizer(comm, rank, &o, &params) != Status::kOk) return "ERROR: " + lastError();
  size_t bytes = 0, written = 0;
  (void)o->stateSize(&bytes);
  std::vector<uint8_t> blob(bytes);
  if (o->saveState(blob.data(), blob.size(), &written) != Status::kOk)
    return "ERROR: save: " + lastError();
  std::ofstream(blobPath(rank), std::ios::binary)
      .write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(written));
  return "saved";
}

std::string checkpoint(Comm& comm, int rank) {
  std::unique_ptr<Optimizer> o;
  std::vector<float> params;
  if (trainedOptimizer(comm, rank, &o, &params) != Status::kOk) return "ERROR: " + lastError();
  std::string report;
  // A blob of the flat layout (saved by the job before) is refused.
  std::ifstream in(blobPath(rank), std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string flat = text.str();
  std::remove(blobPath(rank).c_str());
  const Status refused = o->loadState(flat.data(), flat.size());
  report += std::string("flat: ") + statusName(refused) +
            (lastError().find("saved under the flat compressed allreduce") != std::string::npos
                 ? " named"
                 : " unnamed: " + lastError());
  // Its own blob round-trips: a fresh optimizer loads it and saves the same
  // bytes, and both take the same next step.
  size_t bytes = 0, written = 0;
  (void)o->stateSize(&bytes);
  std::vector<uint8_t> blob(bytes), again(bytes);
  if (o->saveState(blob.data(), blob.size(), &written) != Status::kOk)
    return "ERROR: save: " + lastError();
  optim::Config config;
  config.warmupSteps = 2;
  std::unique_ptr<Optimizer> copy;
  if (comm.createOptimizer(params.size(), config, &copy) != Status::kOk ||
      copy->loadState(blob.data(), written) != Status::kOk)
    return "ERROR: load: " + lastError();
  size_t written2 = 0;
  if (copy->saveState(again.data(), again.size(), &written2) != Status::kOk)
    return "ERROR: save again: " + lastError();
  report += blob == again && written == written2 ? " roundtrip" : " differs";
  std::vector<float> p1 = params, p2 = params, g(params.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = inputValue(rank, i, 9);
  if (o->step(p1.data(), g.data(), 0.01f) != Status::kOk ||
      copy->step(p2.data(), g.data(), 0.01f) != Status::kOk)
    return "ERROR: step: " + lastError();
  report += p1 == p2 ? " same-step" : " other-step";
  // The residual sections are the slice's: far smaller than the buffer.
  size_t flatBytes = flat.size();
  report += written < flatBytes ? " smaller" : " not-smaller";
  return report;
}

TEST(Hierarchy, OptimizerCheckpointKeepsBothResidualLevels) {
  expectEverywhere(runRanks(4, hosts(2, {{"SQUALL_HIERARCHY", "off"}}), saveBlob), "saved",
                   "flat save");
  expectEverywhere(runRanks(4, hosts(2), checkpoint),
                   "flat: invalid usage named roundtrip same-step smaller", "hierarchical");
}

// A local peer that dies: the others fail with an error naming it well
// before the deadline.
std::string deadPeer(Comm& comm, int rank) {
  const size_t count = 100000;
  std::unique_ptr<Compressor> c;
  if (comm.createCompressor(count, codec::Spec{}, &c) != Status::kOk)
    return "ERROR: createCompressor: " + lastError();
  std::vector<uint8_t> in, out(count * 4);
  fill(DataType::kF32, &in, count, rank, 0);
  if (comm.compressedAllReduce(in.data(), out.data(), DataType::kF32, ReduceOp::kSum, *c) !=
      Status::kOk)
    return "ERROR: first call: " + lastError();
  if (rank == 1) _exit(0);
  const auto start = std::chrono::steady_clock::now();
  const Status s =
      comm.compressedAllReduce(in.data(), out.data(), DataType::kF32, ReduceOp::kSum, *c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::string(statusName(s)) + (seconds < 10 ? " fast " : " slow ") + lastError();
}

TEST(Hierarchy, DeadLocalPeerFailsTheOthersNamingIt) {
  const std::vector<std::string> reports = runRanks(4, hosts(2), deadPeer, /*timeout*/ 30);
  std::printf("rank 0: %s\n", reports[0].c_str());
  for (size_t r = 0; r < reports.size(); ++r) {
    if (r == 1) continue;
    EXPECT_EQ(reports[r].find("success"), std::string::npos) << "rank " << r << ": " << reports[r];
    EXPECT_NE(reports[r].find(" fast "), std::string::npos) << "rank " << r << ": " << reports[r];
    EXPECT_NE(reports[r].find("rank 1"), std::string::npos) << "rank " << r << ": " << reports[r];
  }
}

}  // namespace
}  // namespace squall::core
