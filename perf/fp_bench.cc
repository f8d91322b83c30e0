// fp_bench: full-precision allreduce time, Squall against Open MPI, measured
// the same way (perf/benchlib/gloo_allreduce.py does the same for gloo):
//
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. SQUALL_PORT=.. fp_bench --lib squall -b 4K -e 256M
//   mpirun -np 4 --mca pml ob1 --mca btl tcp,self fp_bench --lib mpi ...  (built with MPI)
//
// Per size: -w warmup calls, then -n timed calls, each after a barrier; the
// time of one call is the slowest rank's (max over ranks of each rank's
// median). One JSON object per size on stdout (rank 0), so that
// perf/bench.py peers can put the libraries side by side. Buffers are allocated
// and touched once per size, outside the timed calls, as a training loop's
// gradient buffers would be.
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
  std::string lib = "squall";
  size_t minBytes = 1 << 20;
  size_t maxBytes = 256 << 20;
  double factor = 4;
  int iters = 10;
  int warmup = 3;
  std::string dtype = "float";
  std::string op = "sum";
  std::string label;  // free text copied into every row (the link, the run)
};

[[noreturn]] void usage(const char* problem) {
  if (problem != nullptr) std::fprintf(stderr, "fp_bench: %s\n", problem);
  std::fprintf(stderr,
               "usage: fp_bench [--lib squall|mpi] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]\n"
               "                [-w WARMUP] [-d float|double|half|bfloat16|int32|int64]\n"
               "                [-o sum|avg|min|max] [--label TEXT]\n");
  std::exit(2);
}

size_t parseSize(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v < 0) usage("bad size");
  if (*end == 'K' || *end == 'k') v *= 1024, ++end;
  if (*end == 'M' || *end == 'm') v *= 1024.0 * 1024, ++end;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, ++end;
  if (*end != '\0') usage("bad size suffix");
  return static_cast<size_t>(v);
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value for " + f).c_str());
      return argv[++i];
    };
    if (f == "--lib")
      a.lib = value();
    else if (f == "-b")
      a.minBytes = parseSize(value());
    else if (f == "-e")
      a.maxBytes = parseSize(value());
    else if (f == "-f")
      a.factor = std::atof(value());
    else if (f == "-n")
      a.iters = std::atoi(value());
    else if (f == "-w")
      a.warmup = std::atoi(value());
    else if (f == "-d")
      a.dtype = value();
    else if (f == "-o")
      a.op = value();
    else if (f == "--label")
      a.label = value();
    else
      usage(("unknown flag " + f).c_str());
  }
  if (a.factor <= 1 || a.iters < 1 || a.warmup < 0 || a.minBytes > a.maxBytes)
    usage("need -f > 1, -n >= 1, -w >= 0, -b <= -e");
  if (a.lib != "squall" && a.lib != "mpi") usage("--lib takes squall or mpi");
  return a;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One library behind the same four calls.
struct Lib {
  virtual ~Lib() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  virtual void allReduce(const void* in, void* out, size_t count) = 0;
  virtual double maxOverRanks(double v) = 0;
  virtual size_t elementBytes() const = 0;
};

[[noreturn]] void fail(const char* what, squallResult_t r) {
  std::fprintf(stderr, "fp_bench: %s failed: %s: %s\n", what, squallGetErrorString(r),
               squallGetLastError());
  std::exit(1);
}

struct SquallLib final : Lib {
  squallComm_t comm = nullptr;
  squallDataType_t dtype = squallFloat32;
  squallRedOp_t op = squallSum;
  int rank_ = 0, size_ = 1;
  SquallLib(const Args& a) {
    const std::pair<const char*, squallDataType_t> types[] = {
        {"float", squallFloat32},     {"double", squallFloat64}, {"half", squallFloat16},
        {"bfloat16", squallBfloat16}, {"int32", squallInt32},    {"int64", squallInt64}};
    const std::pair<const char*, squallRedOp_t> ops[] = {
        {"sum", squallSum}, {"avg", squallAvg}, {"min", squallMin}, {"max", squallMax}};
    bool typeKnown = false, opKnown = false;
    for (const auto& [name, t] : types)
      if (a.dtype == name) dtype = t, typeKnown = true;
    for (const auto& [name, o] : ops)
      if (a.op == name) op = o, opKnown = true;
    if (!typeKnown || !opKnown) usage("unknown -d or -o");
    squallConfig_t config = SQUALL_CONFIG_INIT;
    squallResult_t r = squallCommInitFromEnv(&comm, &config);
    if (r != squallSuccess) fail("squallCommInitFromEnv", r);
    squallCommRank(comm, &rank_);
    squallCommSize(comm, &size_);
  }
  ~SquallLib() override { squallCommDestroy(comm); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override {
    const squallResult_t r = squallBarrier(comm);
    if (r != squallSuccess) fail("squallBarrier", r);
  }
  void allReduce(const void* in, void* out, size_t count) override {
    const squallResult_t r = squallAllReduce(in, out, count, dtype, op, comm);
    if (r != squallSuccess) fail("squallAllReduce", r);
  }
  double maxOverRanks(double v) override {
    double out = v;
    const squallResult_t r = squallAllReduce(&v, &out, 1, squallFloat64, squallMax, comm);
    if (r != squallSuccess) fail("squallAllReduce", r);
    return out;
  }
  size_t elementBytes() const override {
    return dtype == squallFloat16 || dtype == squallBfloat16 ? 2
           : dtype == squallFloat32 || dtype == squallInt32  ? 4
                                                             : 8;
  }
};

#if defined(SQUALL_PERF_MPI)
struct MpiLib final : Lib {
  MPI_Datatype dtype = MPI_FLOAT;
  MPI_Op op = MPI_SUM;
  size_t esize = 4;
  int rank_ = 0, size_ = 1;
  MpiLib(int* argc, char*** argv, const Args& a) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // MPI has no half types nor an average: those rows are Squall's alone.
    if (a.dtype == "float")
      dtype = MPI_FLOAT, esize = 4;
    else if (a.dtype == "double")
      dtype = MPI_DOUBLE, esize = 8;
    else if (a.dtype == "int32")
      dtype = MPI_INT32_T, esize = 4;
    else if (a.dtype == "int64")
      dtype = MPI_INT64_T, esize = 8;
    else
      usage("--lib mpi takes -d float, double, int32 or int64");
    if (a.op == "sum")
      op = MPI_SUM;
    else if (a.op == "min")
      op = MPI_MIN;
    else if (a.op == "max")
      op = MPI_MAX;
    else
      usage("--lib mpi takes -o sum, min or max");
  }
  ~MpiLib() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  void allReduce(const void* in, void* out, size_t count) override {
    MPI_Allreduce(in, out, static_cast<int>(count), dtype, op, MPI_COMM_WORLD);
  }
  double maxOverRanks(double v) override {
    double out = v;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }
  size_t elementBytes() const override { return esize; }
};
#endif

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Args& a, Lib& lib) {
  // minBytes, minBytes * factor, ... up to maxBytes (just minBytes for a factor <= 1).
  const double lo = static_cast<double>(a.minBytes);
  const double hi = static_cast<double>(a.maxBytes);
  const int steps =
      a.factor > 1 && hi >= lo && lo > 0
          ? static_cast<int>(std::floor(std::log(hi / lo) / std::log(a.factor) + 1e-9))
          : 0;
  std::vector<double> sweep;
  sweep.reserve(static_cast<size_t>(steps) + 1);
  for (int k = 0; k <= steps; ++k) sweep.push_back(lo * std::pow(a.factor, k));
  const size_t esize = lib.elementBytes();
  for (const double bytesF : sweep) {
    const size_t count = static_cast<size_t>(bytesF) / esize;
    if (count == 0) continue;
    // Small integers are exact in every type, so the sums are too.
    std::vector<uint8_t> in(count * esize), out(count * esize);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>((i * 7 + 1) & 0x1f);
    if (esize == 2)  // keep fp16/bf16 exponents away from inf and NaN
      for (size_t i = 1; i < in.size(); i += 2) in[i] = 0x3c;
    std::memset(out.data(), 0, out.size());
    for (int i = 0; i < a.warmup; ++i) lib.allReduce(in.data(), out.data(), count);
    std::vector<double> times;
    times.reserve(static_cast<size_t>(a.iters));
    for (int i = 0; i < a.iters; ++i) {
      lib.barrier();
      const double t0 = now();
      lib.allReduce(in.data(), out.data(), count);
      times.push_back(now() - t0);
    }
    const double slowest = lib.maxOverRanks(median(times));
    const double fastest = -lib.maxOverRanks(-*std::min_element(times.begin(), times.end()));
    if (lib.rank() == 0) {
      std::printf(
          "{\"lib\": \"%s\", \"label\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"type\": \"%s\", "
          "\"op\": \"%s\", \"median_us\": %.3f, \"min_us\": %.3f}\n",
          a.lib.c_str(), a.label.c_str(), lib.size(), count * esize, a.dtype.c_str(), a.op.c_str(),
          slowest * 1e6, fastest * 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parseArgs(argc, argv);
  if (a.lib == "mpi") {
#if defined(SQUALL_PERF_MPI)
    MpiLib lib(&argc, &argv, a);
    return run(a, lib);
#else
    usage("this fp_bench was built without MPI");
#endif
  }
  SquallLib lib(a);
  return run(a, lib);
}
