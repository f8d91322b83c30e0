// squall_perf: compressed allreduce vs full precision, in the style of
// nccl-tests. Uses only the public C API, as an application would.
//
//   squall_perf -np 4 -b 1M -e 256M -f 4 --codec onebit --vs none
//   mpirun -np 4 squall_perf ...          (when built with MPI)
//   torchrun --nproc-per-node 4 squall_perf ...
//
// Columns: size (logical bytes of the buffer), count, type, redop, time (us,
// median over -n iterations, slowest rank), algbw = size / time, busbw =
// algbw * 2(n-1)/n (the ring-allreduce convention, on the logical size),
// wire = bytes this rank sent per call, ratio = what a ring fp32 allreduce
// sends (2(n-1)/n * size) / wire, and with --vs the baseline's time over the
// same transport and the speedup.
//
// Memory: mem(MB) is what one rank's call moves through main memory by the
// model below (memoryBytes), and mem(us) that over the streaming bandwidth
// each rank got while all ranks of this host copied at once (measured at
// start, streamCopyBandwidth): the call's floor when its buffers are far
// larger than the caches. x mem = time / mem(us).
#include <netinet/in.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "squall/squall.h"

#if defined(SQUALL_PERF_MPI)
#include <mpi.h>
#endif

namespace {

struct Args {
  size_t minBytes = 1 << 20;
  size_t maxBytes = 64 << 20;
  double factor = 4;
  int iters = 10;
  int warmup = 3;
  bool check = true;
  squallDataType_t dtype = squallFloat32;
  squallRedOp_t op = squallAvg;
  std::string codec = "onebit";
  long block = -1;
  std::string vs;  // "", or "none": full-precision allreduce baseline
  int np = 0;      // spawn this many local ranks
  std::string json;
  squallTransport_t transport = squallTransportDefault;
  bool times = false;  // print every iteration's time, per rank (to see a bimodal spread)
};

[[noreturn]] void usage(const char* argv0, const char* problem) {
  if (problem != nullptr) std::fprintf(stderr, "squall_perf: %s\n", problem);
  std::fprintf(stderr,
               "usage: %s [-np N] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
               "          [-d float|half|bfloat16] [-o sum|avg] [--codec SPEC] [--block B]\n"
               "          [--vs none] [--transport ucx|tcp] [--json FILE]\n"
               "          [--times]\n"
               "sizes accept K, M, G suffixes; SPEC as in squallCodecSpecParse\n",
               argv0);
  std::exit(2);
}

size_t parseSize(const char* text, const char* argv0) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v < 0) usage(argv0, "bad size");
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      ++end;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      ++end;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      ++end;
      break;
    default: break;
  }
  if (*end != '\0') usage(argv0, "bad size suffix");
  return static_cast<size_t>(v);
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0], ("missing value for " + f).c_str());
      return argv[++i];
    };
    if (f == "-b")
      a.minBytes = parseSize(value(), argv[0]);
    else if (f == "-e")
      a.maxBytes = parseSize(value(), argv[0]);
    else if (f == "-f")
      a.factor = std::atof(value());
    else if (f == "-n")
      a.iters = std::atoi(value());
    else if (f == "-w")
      a.warmup = std::atoi(value());
    else if (f == "-c")
      a.check = std::atoi(value()) != 0;
    else if (f == "-np")
      a.np = std::atoi(value());
    else if (f == "--codec")
      a.codec = value();
    else if (f == "--block")
      a.block = std::atol(value());
    else if (f == "--vs")
      a.vs = value();
    else if (f == "--json")
      a.json = value();
    else if (f == "--times")
      a.times = true;
    else if (f == "-d") {
      std::string d = value();
      if (d == "float")
        a.dtype = squallFloat32;
      else if (d == "half")
        a.dtype = squallFloat16;
      else if (d == "bfloat16")
        a.dtype = squallBfloat16;
      else
        usage(argv[0], "-d takes float, half or bfloat16");
    } else if (f == "-o") {
      std::string o = value();
      if (o == "sum")
        a.op = squallSum;
      else if (o == "avg")
        a.op = squallAvg;
      else
        usage(argv[0], "-o takes sum or avg");
    } else if (f == "--transport") {
      std::string t = value();
      if (t == "ucx")
        a.transport = squallTransportUcx;
      else if (t == "tcp")
        a.transport = squallTransportTcp;
      else
        usage(argv[0], "--transport takes ucx or tcp");
    } else if (f == "-h" || f == "--help") {
      usage(argv[0], nullptr);
    } else {
      usage(argv[0], ("unknown flag " + f).c_str());
    }
  }
  if (a.factor <= 1 || a.iters < 1 || a.warmup < 0 || a.minBytes > a.maxBytes)
    usage(argv[0], "need -f > 1, -n >= 1, -w >= 0, -b <= -e");
  if (!a.vs.empty() && a.vs != "none") usage(argv[0], "--vs takes none (full precision)");
  return a;
}

#define CHECK(call)                                                                             \
  do {                                                                                          \
    squallResult_t r_ = (call);                                                                 \
    if (r_ != squallSuccess) {                                                                  \
      std::fprintf(stderr, "squall_perf: %s failed: %s: %s\n", #call, squallGetErrorString(r_), \
                   squallGetLastError());                                                       \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t dtypeBytes(squallDataType_t t) { return t == squallFloat32 ? 4 : 2; }
const char* dtypeName(squallDataType_t t) {
  return t == squallFloat32 ? "float" : t == squallFloat16 ? "half" : "bfloat16";
}

uint16_t floatToBf16Bits(float f) {  // exact for the test values (few mantissa bits)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// Fills `buffer` with rank-dependent data of type t (values exact in bf16/half).
void fill(std::vector<uint8_t>& buffer, size_t count, squallDataType_t t, int rank) {
  for (size_t i = 0; i < count; ++i) {
    const float v =
        static_cast<float>(
            static_cast<int>((i * 2654435761u + static_cast<size_t>(rank) * 97u) % 17) - 8) *
        0.25f;
    if (t == squallFloat32) {
      std::memcpy(buffer.data() + 4 * i, &v, 4);
    } else if (t == squallBfloat16) {
      uint16_t h = floatToBf16Bits(v);
      std::memcpy(buffer.data() + 2 * i, &h, 2);
    } else {
      // |v| <= 2 in quarter steps: build the half directly.
      uint16_t h = 0;
      if (v != 0.0f) {
        int e = 0;
        float m = std::frexp(std::fabs(v), &e);  // v = m * 2^e, m in [0.5, 1)
        h = static_cast<uint16_t>(((e - 1 + 15) << 10) | static_cast<int>((m * 2 - 1) * 1024)) |
            (v < 0 ? 0x8000 : 0);
      }
      std::memcpy(buffer.data() + 2 * i, &h, 2);
    }
  }
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Slowest rank's value, so the table reflects the collective's completion.
double maxOverRanks(double v, squallComm_t comm) {
  double out = v;
  CHECK(squallAllReduce(&v, &out, 1, squallFloat64, squallMax, comm));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Call>
double timeIt(const Args& a, squallComm_t comm, Call&& call) {
  for (int i = 0; i < a.warmup; ++i) call();
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    CHECK(squallBarrier(comm));
    const double t0 = now();
    call();
    times.push_back(now() - t0);
  }
  if (a.times) {
    int rank = 0;
    CHECK(squallCommRank(comm, &rank));
    std::fprintf(stderr, "# times ms, rank %d:", rank);
    for (double t : times) std::fprintf(stderr, " %.1f", t * 1e3);
    std::fprintf(stderr, "\n");
  }
  return maxOverRanks(median(times), comm);
}

struct Row {
  size_t bytes, count;
  double time, algbw, busbw, ratio, baseTime;
  uint64_t wire;
  bool ok;
  const char* algorithm;
  double memoryBytes, memoryTime;
};

// ---- the memory-traffic floor ---------------------------------------------

// Bytes one rank's compressed allreduce of `count` elements of `elem` bytes
// moves through main memory, reads plus writes, with the fused passes and
// streaming stores of the library (codec::decodeSum / encodeSum, Stores):
//   encode      x (elem), the worker residual read and its new half written
//               (4 + 4), the encodings written (E(N))
//   serve       twophase only, the server's chunk of C = N / n: the n
//               encodings read, the server residual read and written (4 + 4),
//               its encoding written
//   decode      the encodings read (allgather: n of every element; twophase:
//               one), the output written (elem)
// E(m) is the encoded size of m elements. The fp32 sums live in an L1 tile
// and the encodings of a segment in the L2 cache, so they are counted once
// (an upper estimate: the slots are cache-resident too). Cached stores would
// add each written byte once more (its line read before it is overwritten).
double memoryBytes(const char* algorithm, int n, size_t count, size_t elem, double encodedPerElem) {
  const double N = static_cast<double>(count);
  if (n == 1) return 2.0 * N * static_cast<double>(elem);  // the input copied to the output
  const double E = encodedPerElem;
  const double encode = N * (static_cast<double>(elem) + 8.0 + E);
  if (std::strcmp(algorithm, "allgather") == 0)
    return encode + N * (n * E + static_cast<double>(elem));
  const double chunk = N / n;
  const double serve = chunk * (n * E + 8.0 + E);
  return encode + serve + N * (E + static_cast<double>(elem));
}

// Which algorithm a call ran, from the bytes it sent: the all-gather sends
// (n - 1) E, the two-phase 2 (n - 1) / n E; at n = 2 they are the same size
// and auto takes the all-gather.
const char* algorithmFromWire(int n, uint64_t wire, size_t encodedBytes) {
  if (n <= 2) return "allgather";
  const double allGather = (n - 1.0) * static_cast<double>(encodedBytes);
  const double twoPhase = 2.0 * (n - 1.0) / n * static_cast<double>(encodedBytes);
  const double w = static_cast<double>(wire);
  return std::fabs(w - allGather) < std::fabs(w - twoPhase) ? "allgather" : "twophase";
}

// dst = src with streaming stores: the kind of store the library uses for
// large buffers (its memory traffic is reads plus writes, no read of the
// written lines).
void streamCopy(const float* src, float* dst, size_t count) {
#if defined(__SSE2__)
  const size_t whole = count / 16 * 16;
  for (size_t i = 0; i < whole; i += 16)
    for (size_t k = 0; k < 16; k += 4) _mm_stream_ps(dst + i + k, _mm_load_ps(src + i + k));
  std::memcpy(dst + whole, src + whole, (count - whole) * sizeof(float));
  _mm_sfence();
#else
  std::memcpy(dst, src, count * sizeof(float));
#endif
}

// Bytes per second (read + written) one rank streams while every rank of the
// communicator copies at the same time: each rank copies 64 MiB 8 times back
// to back (long next to the skew of the barrier's release, so the copies
// overlap), the median of 3 such rounds, the slowest rank's. On one host the
// ranks share the memory bus (and, with more ranks than cores, the cores),
// as they do in the allreduce.
double streamCopyBandwidth(squallComm_t comm) {
  constexpr int kCopies = 8;
  const size_t count = size_t{16} << 20;
  float* src = static_cast<float*>(std::aligned_alloc(64, count * sizeof(float)));
  float* dst = static_cast<float*>(std::aligned_alloc(64, count * sizeof(float)));
  if (src == nullptr || dst == nullptr) {
    std::fprintf(stderr, "squall_perf: no memory for the bandwidth measurement\n");
    std::exit(1);
  }
  for (size_t i = 0; i < count; ++i) src[i] = static_cast<float>(i & 1023), dst[i] = 0.0f;
  streamCopy(src, dst, count);  // faults the pages in
  std::vector<double> times;
  for (int round = 0; round < 3; ++round) {
    CHECK(squallBarrier(comm));
    const double t0 = now();
    for (int i = 0; i < kCopies; ++i) streamCopy(src, dst, count);
    times.push_back(now() - t0);
  }
  std::free(src);
  std::free(dst);
  const double slowest = maxOverRanks(median(times), comm);
  return kCopies * 2.0 * sizeof(float) * static_cast<double>(count) / slowest;
}

int run(const Args& a, squallComm_t comm) {
  int rank = 0, n = 1;
  CHECK(squallCommRank(comm, &rank));
  CHECK(squallCommSize(comm, &n));
  const char* transport = "?";
  CHECK(squallCommTransport(comm, &transport));
  squallCodecSpec_t spec;
  CHECK(squallCodecSpecParse(a.codec.c_str(), &spec));
  if (a.block > 0) spec.blockSize = static_cast<uint32_t>(a.block);
  const double streamBandwidth = streamCopyBandwidth(comm);
  if (rank == 0) {
    std::printf("# squall_perf: %d ranks, transport %s, codec %s block %u, %s, cpu codec %s\n", n,
                transport, a.codec.c_str(), spec.blockSize, a.op == squallAvg ? "avg" : "sum",
                squallCodecImplementation());
    std::printf("# streaming copy: %.2f GB/s per rank, %d ranks copying at once\n",
                streamBandwidth / 1e9, n);
    std::printf("#\n# %10s %12s %8s %5s %10s %8s %8s %12s %7s %9s %9s %6s", "size", "count", "type",
                "redop", "time(us)", "algbw", "busbw", "wire(B)", "ratio", "mem(MB)", "mem(us)",
                "x mem");
    if (!a.vs.empty()) std::printf(" %12s %8s", "fp32(us)", "speedup");
    std::printf(" %6s\n", "check");
  }
  std::vector<Row> rows;
  const size_t elem = dtypeBytes(a.dtype);
  // Progress on stderr (stdout stays the table): size k of N, elapsed, and an
  // ETA from the time per byte so far, since a size's time grows with it.
  double plannedBytes = 0, doneBytes = 0;
  int plannedSizes = 0;
  // The geometric sweep, listed once so that no loop counts with a double.
  std::vector<double> sweep;
  double next = static_cast<double>(a.minBytes);
  while (next <= static_cast<double>(a.maxBytes)) {
    sweep.push_back(next);
    next *= a.factor;
  }
  for (const double b : sweep)
    if (static_cast<size_t>(b) / elem > 0) plannedBytes += b, ++plannedSizes;
  const auto started = std::chrono::steady_clock::now();
  for (const double bytesF : sweep) {
    const size_t count = static_cast<size_t>(bytesF) / elem;
    if (count == 0) continue;
    if (rank == 0 && plannedSizes > 1) {
      const double spent =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (doneBytes > 0)
        std::fprintf(stderr, "squall_perf: [size %zu/%d] %zu bytes; elapsed %.0f s, ETA %.0f s\n",
                     rows.size() + 1, plannedSizes, count * elem, spent,
                     spent / doneBytes * (plannedBytes - doneBytes));
      else
        std::fprintf(stderr, "squall_perf: [size 1/%d] %zu bytes\n", plannedSizes, count * elem);
    }
    doneBytes += bytesF;
    Row row{};
    row.count = count;
    row.bytes = count * elem;
    std::vector<uint8_t> in(row.bytes), out(row.bytes);
    fill(in, count, a.dtype, rank);
    squallCompressor_t compressor;
    CHECK(squallCompressorCreate(comm, count, &spec, &compressor));
    row.time = timeIt(a, comm, [&] {
      CHECK(squallCompressedAllReduce(in.data(), out.data(), a.dtype, a.op, compressor, comm));
    });
    squallCompressorStats_t stats;
    CHECK(squallCompressorGetStats(compressor, &stats));
    row.wire = stats.bytesSent;
    size_t encodedBytes = 0;
    CHECK(squallEncodedSize(&spec, count, &encodedBytes));
    row.algorithm = algorithmFromWire(n, row.wire, encodedBytes);
    row.memoryBytes = memoryBytes(row.algorithm, n, count, elem,
                                  static_cast<double>(encodedBytes) / static_cast<double>(count));
    row.memoryTime = row.memoryBytes / streamBandwidth;
    row.algbw = static_cast<double>(row.bytes) / row.time / 1e9;
    row.busbw = row.algbw * 2.0 * (n - 1) / n;
    const double ringBytes = 2.0 * (n - 1) / n * static_cast<double>(row.bytes);
    row.ratio = row.wire > 0 ? ringBytes / static_cast<double>(row.wire) : 0;
    row.ok = true;
    if (a.check) {
      // Every rank must hold the same bytes.
      uint64_t mine = fnv1a(out.data(), out.size());
      std::vector<uint64_t> all(static_cast<size_t>(n));
      CHECK(squallAllGather(&mine, all.data(), 1, squallInt64, comm));
      for (uint64_t h : all) row.ok = row.ok && h == all[0];
    }
    CHECK(squallCompressorDestroy(compressor));
    if (!a.vs.empty()) {
      row.baseTime = timeIt(a, comm, [&] {
        CHECK(squallAllReduce(in.data(), out.data(), count, a.dtype, a.op, comm));
      });
    }
    if (rank == 0) {
      std::printf("  %10zu %12zu %8s %5s %10.1f %8.3f %8.3f %12llu %7.1f %9.1f %9.1f %6.2f",
                  row.bytes, row.count, dtypeName(a.dtype), a.op == squallAvg ? "avg" : "sum",
                  row.time * 1e6, row.algbw, row.busbw, static_cast<unsigned long long>(row.wire),
                  row.ratio, row.memoryBytes / 1e6, row.memoryTime * 1e6,
                  row.time / row.memoryTime);
      if (!a.vs.empty()) std::printf(" %12.1f %8.2f", row.baseTime * 1e6, row.baseTime / row.time);
      std::printf(" %6s\n", a.check ? (row.ok ? "ok" : "DIFFER") : "-");
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  bool allOk = true;
  for (const Row& r : rows) allOk = allOk && r.ok;
  if (rank == 0 && !a.json.empty()) {
    FILE* f = std::fopen(a.json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "squall_perf: cannot write %s: %s\n", a.json.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "{\"ranks\": %d, \"transport\": \"%s\", \"codec\": \"%s\", \"block\": %u, "
                 "\"codec_impl\": \"%s\", \"stream_copy_gb_per_s\": %.4f, \"rows\": [\n",
                 n, transport, a.codec.c_str(), spec.blockSize, squallCodecImplementation(),
                 streamBandwidth / 1e9);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "  {\"bytes\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
                   "\"time_us\": %.3f, \"algbw_gbs\": %.6f, \"busbw_gbs\": %.6f, "
                   "\"wire_bytes\": %llu, \"ratio\": %.3f, \"baseline_time_us\": %.3f, "
                   "\"speedup\": %.4f, \"algorithm\": \"%s\", \"memory_bytes\": %.0f, "
                   "\"memory_bound_us\": %.3f, \"check\": %s}%s\n",
                   r.bytes, r.count, dtypeName(a.dtype), a.op == squallAvg ? "avg" : "sum",
                   r.time * 1e6, r.algbw, r.busbw, static_cast<unsigned long long>(r.wire), r.ratio,
                   r.baseTime * 1e6, r.baseTime > 0 ? r.baseTime / r.time : 0.0, r.algorithm,
                   r.memoryBytes, r.memoryTime * 1e6, r.ok ? "true" : "false",
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return allOk ? 0 : 1;
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("squall_perf: cannot find a free port");
    std::exit(1);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// The ranks this program starts itself share a random SQUALL_JOB_SECRET
// (unless one is set), so that no other process can join their job and init
// has no public secret to warn about.
void shareJobSecret() {
  const char* given = std::getenv("SQUALL_JOB_SECRET");
  if (given != nullptr && *given != '\0') return;
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    std::perror("squall_perf: getrandom (the job runs without a secret)");
    return;
  }
  char hex[2 * sizeof(bytes) + 1];
  for (size_t i = 0; i < sizeof(bytes); ++i)
    std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned>(bytes[i]));
  setenv("SQUALL_JOB_SECRET", hex, 1);
}

// -np N: re-executes this program N times as ranks on 127.0.0.1.
int spawn(int np, char** argv) {
  const std::string port = std::to_string(freePort());
  shareJobSecret();
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("squall_perf: fork");
      return 1;
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(np).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("SQUALL_PORT", port.c_str(), 1);
      std::vector<char*> args;
      args.push_back(argv[0]);
      for (int i = 1; argv[i] != nullptr; ++i) {
        if (std::strcmp(argv[i], "-np") == 0) {
          ++i;
          continue;
        }
        args.push_back(argv[i]);
      }
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::perror("squall_perf: exec");
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    pid_t done = wait(&status);
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed && rc == 0) {
      rc = 1;
      std::fprintf(stderr, "squall_perf: rank process %d failed; stopping the others\n",
                   static_cast<int>(done));
      for (pid_t p : pids)
        if (p != done) kill(p, SIGTERM);
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parseArgs(argc, argv);
  if (a.np > 0) return spawn(a.np, argv);
  squallConfig_t config = SQUALL_CONFIG_INIT;
  config.transport = a.transport;
  squallComm_t comm = nullptr;
#if defined(SQUALL_PERF_MPI)
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm world = MPI_COMM_WORLD;
    CHECK(squallCommInitFromMpi(&comm, &world, &config));
    const int rc = run(a, comm);
    CHECK(squallCommDestroy(comm));
    MPI_Finalize();
    return rc;
  }
#endif
  if (std::getenv("WORLD_SIZE") == nullptr) {
    // A single rank: still useful to measure the codec's share of the time.
    setenv("WORLD_SIZE", "1", 1);
    setenv("RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("SQUALL_PORT", std::to_string(freePort()).c_str(), 1);
    shareJobSecret();
  }
  CHECK(squallCommInitFromEnv(&comm, &config));
  const int rc = run(a, comm);
  CHECK(squallCommDestroy(comm));
  return rc;
}
