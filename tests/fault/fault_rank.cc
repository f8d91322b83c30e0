// One rank of a fault-injection job, started by tests/fault/*.py with the
// launcher variables (RANK, WORLD_SIZE, MASTER_ADDR, SQUALL_PORT) through the
// public C API, as an application would.
//
//   fault_rank <tcp|ucx> <allreduce|allgather|compressed> <iterations> [--hold-ms N]
//
// Runs the collective `iterations` times, checks every result, destroys the
// communicator and exits 0 as soon as it is done (the fast shutdown whose
// effect on slower ranks the teardown loop measures). On the first failure
// it prints one line to stdout and exits 1:
//   FAIL <monotonic ms> <iteration> <squallGetLastError()>
// so the driver can tell when the failure was seen and whom it names.
// --hold-ms: before the last iteration, rank 0 waits that long, so the other
// ranks finish first and their teardown races rank 0's last collective.
#include <squall/squall.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

long long monotonicMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

squallComm_t gComm = nullptr;

// Reports the failure, then leaves as a careful application does: the
// communicator is destroyed first, so the abort notices this rank sent
// reach its peers before its connections go.
[[noreturn]] void fail(int iteration, const char* what) {
  std::printf("FAIL %lld %d %s: %s\n", monotonicMs(), iteration, what, squallGetLastError());
  std::fflush(stdout);
  if (gComm != nullptr) squallCommDestroy(gComm);
  std::_Exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: fault_rank <tcp|ucx> <allreduce|allgather|compressed> <iterations> "
                 "[--hold-ms N]\n");
    return 2;
  }
  const std::string transport = argv[1];
  const std::string op = argv[2];
  const int iterations = std::atoi(argv[3]);
  int holdMs = 0;
  for (int i = 4; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--hold-ms") == 0) holdMs = std::atoi(argv[i + 1]);

  squallConfig_t config = SQUALL_CONFIG_INIT;
  config.transport = transport == "ucx" ? squallTransportUcx : squallTransportTcp;
  squallComm_t comm = nullptr;
  if (squallCommInitFromEnv(&comm, &config) != squallSuccess) fail(-1, "init");
  gComm = comm;
  int rank = 0;
  int size = 0;
  squallCommRank(comm, &rank);
  squallCommSize(comm, &size);
  std::printf("READY %lld %d\n", monotonicMs(), rank);
  std::fflush(stdout);

  const size_t count = 4096;
  std::vector<float> in(count);
  std::vector<float> out(count * static_cast<size_t>(size));
  squallCompressor_t compressor = nullptr;
  if (op == "compressed") {
    squallCodecSpec_t spec;
    if (squallCodecSpecParse("int8", &spec) != squallSuccess ||
        squallCompressorCreate(comm, count, &spec, &compressor) != squallSuccess)
      fail(-1, "compressor");
  }
  for (int it = 0; it < iterations; ++it) {
    if (it + 1 == iterations && rank == 0 && holdMs > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + 1 + (i % 7));
    squallResult_t rc = squallSuccess;
    if (op == "allreduce") {
      rc = squallAllReduce(in.data(), out.data(), count, squallFloat32, squallSum, comm);
    } else if (op == "allgather") {
      rc = squallAllGather(in.data(), out.data(), count, squallFloat32, comm);
    } else {
      rc = squallCompressedAllReduce(in.data(), out.data(), squallFloat32, squallSum, compressor,
                                     comm);
    }
    if (rc != squallSuccess) fail(it, op.c_str());
    // Results are checked, so a run that "succeeds" without moving data fails.
    for (size_t i = 0; i < count; ++i) {
      const float base = static_cast<float>(i % 7);
      if (op == "allgather") {
        for (int r = 0; r < size; ++r)
          if (out[static_cast<size_t>(r) * count + i] != static_cast<float>(r + 1) + base)
            fail(it, "allgather result");
      } else {
        const float want = static_cast<float>(size) * static_cast<float>(size + 1) / 2.0f +
                           base * static_cast<float>(size);
        // int8 is block-scaled: allow its quantisation error.
        const float tolerance = op == "compressed" ? 0.05f * want + 0.1f : 0.0f;
        if (std::fabs(out[i] - want) > tolerance) fail(it, "allreduce result");
      }
    }
  }
  if (compressor != nullptr) squallCompressorDestroy(compressor);
  gComm = nullptr;
  if (squallCommDestroy(comm) != squallSuccess) fail(iterations, "destroy");
  std::printf("DONE %lld %d\n", monotonicMs(), rank);
  std::fflush(stdout);
  return 0;
}
