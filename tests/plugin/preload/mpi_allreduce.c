/* An MPI program that knows nothing of Squall, run under libsquall-preload.so.
 *
 * argv[1] = "on": MPI_Allreduce of fp32 sums matches, bit for bit, Squall's
 *   compressed allreduce run by this program itself over libsquall (one
 *   compressor per gradient, as the interposer keys them), while every rank
 *   holds its tensors at other addresses each step; ineligible calls match
 *   PMPI_Allreduce bit for bit; communicators made by Open MPI (split, dup,
 *   create_group, intercommunicators) work, including freed and remade ones.
 * argv[1] = "learn" N: the first N calls are exact (the step is being learnt,
 *   or a warmup), the rest match the reference.
 * argv[1] = "off" (SQUALL_PRELOAD_ENABLE=0): every call matches PMPI exactly.
 * Exits non-zero with a message on the first mismatch. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <squall/squall.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank_, size_;
static long exactCalls_; /* "learn N": the first N calls run at full precision */

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      fprintf(stderr, "rank %d: FAILED: ", rank_);       \
      fprintf(stderr, __VA_ARGS__);                      \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__); \
      MPI_Abort(MPI_COMM_WORLD, 1);                      \
    }                                                    \
  } while (0)

#define SQ(call) CHECK((call) == squallSuccess, "%s: %s", #call, squallGetLastError())

static void fill(float* x, size_t n, unsigned seed) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((int32_t)(s >> 8) - (1 << 23)) / (float)(1 << 23);
  }
}

/* Tensors at addresses that differ between ranks and between steps. */
static float* shifted(size_t n, int step, void** base) {
  const size_t shift = (size_t)(rank_ * 17 + step * 5) % 64;
  *base = malloc((n + 64) * sizeof(float));
  return (float*)*base + shift;
}

static void gradients(int mode) {
  enum { kSteps = 6, kTensors = 3 };
  const size_t counts[kTensors] = {5000, 3000, 2048};
  const long learn = mode == 'l' ? exactCalls_ : 0;
  squallComm_t ref;
  MPI_Comm world = MPI_COMM_WORLD;
  SQ(squallCommInitFromMpi(&ref, &world, NULL));
  squallCodecSpec_t spec;
  SQ(squallCodecSpecParse(
      getenv("SQUALL_PRELOAD_CODEC") ? getenv("SQUALL_PRELOAD_CODEC") : "int4:block=256", &spec));
  squallCompressor_t comp[kTensors] = {NULL, NULL, NULL};
  long call = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (mode == 'l') {
      struct timespec pause = {0, 20 * 1000 * 1000}; /* the "forward pass" */
      nanosleep(&pause, NULL);
    }
    for (int t = 0; t < kTensors; ++t, ++call) {
      const size_t n = counts[t];
      void *b1, *b2;
      float* in = shifted(n, step, &b1);
      float* out = shifted(n, step + 1, &b2);
      float* expect = malloc(n * sizeof(float));
      fill(in, n, (unsigned)(rank_ * 1000 + step * 10 + t));
      const int inPlace = t == 1;
      if (mode == 'o' || call < learn) {
        CHECK(PMPI_Allreduce(in, expect, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
              "PMPI_Allreduce");
      } else {
        if (comp[t] == NULL) {
          /* The interposer puts each call's codec blocks on the step's. */
          size_t offset = 0;
          for (int u = 0; u < t; ++u) offset += counts[u];
          /* blockSize is 0 for the codes without blocks. */
          const size_t phase = spec.blockSize ? offset % spec.blockSize : 0;
          SQ(squallCompressorCreateAt(ref, n, phase, &spec, &comp[t]));
          /* As the interposer's compressors: the fewest bytes, and int8 for
           * the two-phase all-gather behind int2 and int4
           * (SQUALL_PRELOAD_GATHER_CODEC=auto). */
          SQ(squallCompressorSetAlgorithm(comp[t], squallCompressorAlgoBytes));
          if (spec.codec == squallCodecInt4 || spec.codec == squallCodecInt2) {
            squallCodecSpec_t wide;
            SQ(squallCodecSpecParse("int8", &wide));
            SQ(squallCompressorSetGatherCodec(comp[t], &wide));
          }
        }
        SQ(squallCompressedAllReduce(in, expect, squallFloat32, squallSum, comp[t], ref));
      }
      if (inPlace) {
        CHECK(MPI_Allreduce(MPI_IN_PLACE, in, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) ==
                  MPI_SUCCESS,
              "MPI_Allreduce in place");
        memcpy(out, in, n * sizeof(float));
      } else {
        CHECK(MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
              "MPI_Allreduce");
      }
      CHECK(memcmp(out, expect, n * sizeof(float)) == 0,
            "step %d tensor %d (%zu elements): output differs from the %s", step, t, n,
            mode == 'o' || call < learn ? "full-precision PMPI result" : "compressed reference");
      free(expect);
      free(b1);
      free(b2);
    }
  }
  for (int t = 0; t < kTensors; ++t)
    if (comp[t]) SQ(squallCompressorDestroy(comp[t]));
  SQ(squallCommDestroy(ref));
}

/* Calls the interposer must not touch: bit-exact against PMPI_Allreduce. */
static void ineligible(MPI_Comm comm, const char* where) {
  double d[300], dr[300], de[300];
  float f[20000], fr[20000], fe[20000];
  int i32[100], ir[100], ie[100];
  for (int i = 0; i < 300; ++i) d[i] = (rank_ + 1) * 0.1 + i * 1e-3;
  fill(f, 20000, 77 + (unsigned)rank_);
  for (int i = 0; i < 100; ++i) i32[i] = rank_ * 100 + i;
  CHECK(MPI_Allreduce(d, dr, 300, MPI_DOUBLE, MPI_SUM, comm) == MPI_SUCCESS, "double");
  CHECK(PMPI_Allreduce(d, de, 300, MPI_DOUBLE, MPI_SUM, comm) == MPI_SUCCESS, "double");
  CHECK(memcmp(dr, de, sizeof dr) == 0, "%s: MPI_DOUBLE sum differs from PMPI", where);
  CHECK(MPI_Allreduce(f, fr, 20000, MPI_FLOAT, MPI_MAX, comm) == MPI_SUCCESS, "max");
  CHECK(PMPI_Allreduce(f, fe, 20000, MPI_FLOAT, MPI_MAX, comm) == MPI_SUCCESS, "max");
  CHECK(memcmp(fr, fe, sizeof fr) == 0, "%s: MPI_FLOAT max differs from PMPI", where);
  CHECK(MPI_Allreduce(f, fr, 100, MPI_FLOAT, MPI_SUM, comm) == MPI_SUCCESS, "small");
  CHECK(PMPI_Allreduce(f, fe, 100, MPI_FLOAT, MPI_SUM, comm) == MPI_SUCCESS, "small");
  CHECK(memcmp(fr, fe, 100 * sizeof(float)) == 0, "%s: small fp32 sum differs from PMPI", where);
  CHECK(MPI_Allreduce(i32, ir, 100, MPI_INT, MPI_SUM, comm) == MPI_SUCCESS, "int");
  CHECK(PMPI_Allreduce(i32, ie, 100, MPI_INT, MPI_SUM, comm) == MPI_SUCCESS, "int");
  CHECK(memcmp(ir, ie, sizeof ir) == 0, "%s: MPI_INT sum differs from PMPI", where);
}

/* An eligible call on `comm`: every member ends with the same bytes, close to
 * the exact sum for a codec that is not 1-bit, and exact with the switch off. */
static void agreeOn(MPI_Comm comm, int mode, const char* where) {
  enum { kN = 4096 };
  static float x[kN], y[kN], exact[kN], first[kN];
  int crank;
  MPI_Comm_rank(comm, &crank);
  fill(x, kN, 500 + (unsigned)rank_);
  CHECK(MPI_Allreduce(x, y, kN, MPI_FLOAT, MPI_SUM, comm) == MPI_SUCCESS, "%s", where);
  CHECK(PMPI_Allreduce(x, exact, kN, MPI_FLOAT, MPI_SUM, comm) == MPI_SUCCESS, "%s", where);
  memcpy(first, y, sizeof y);
  CHECK(PMPI_Bcast(first, kN, MPI_FLOAT, 0, comm) == MPI_SUCCESS, "bcast");
  CHECK(memcmp(first, y, sizeof y) == 0, "%s: ranks disagree on the result", where);
  if (mode == 'o')
    CHECK(memcmp(y, exact, sizeof y) == 0, "%s: not exact with the switch off", where);
}

static void communicators(int mode) {
  ineligible(MPI_COMM_WORLD, "world");
  for (int round = 0; round < 2; ++round) { /* freed and made again: handles get reused */
    MPI_Comm dup, half, group;
    CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup) == MPI_SUCCESS, "dup");
    agreeOn(dup, mode, "dup of world");
    CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ % 2, -rank_, &half) == MPI_SUCCESS, "split");
    agreeOn(half, mode, "split");
    ineligible(half, "split");
    MPI_Group all, evens;
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    int ranks[64], k = 0;
    for (int r = rank_ % 2; r < size_; r += 2) ranks[k++] = r;
    MPI_Group_incl(all, k, ranks, &evens); /* my parity's ranks */
    /* collective over the group's members only */
    CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, evens, 7, &group) == MPI_SUCCESS, "create_group");
    agreeOn(group, mode, "create_group");
    MPI_Comm_free(&group);
    MPI_Group_free(&evens);
    MPI_Group_free(&all);
    if (size_ >= 2) { /* an intercommunicator between the halves: passed through */
      MPI_Comm inter, byRank;
      CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank_ % 2, rank_, &byRank) == MPI_SUCCESS, "split");
      CHECK(MPI_Intercomm_create(byRank, 0, MPI_COMM_WORLD, rank_ % 2 ? 0 : 1, 9, &inter) ==
                MPI_SUCCESS,
            "intercomm");
      float a[20000], b[20000], c[20000];
      fill(a, 20000, 900 + (unsigned)rank_);
      CHECK(MPI_Allreduce(a, b, 20000, MPI_FLOAT, MPI_SUM, inter) == MPI_SUCCESS, "inter");
      CHECK(PMPI_Allreduce(a, c, 20000, MPI_FLOAT, MPI_SUM, inter) == MPI_SUCCESS, "inter");
      CHECK(memcmp(b, c, sizeof b) == 0, "intercommunicator sum differs from PMPI");
      MPI_Comm_free(&inter);
      MPI_Comm_free(&byRank);
    }
    MPI_Comm_free(&half);
    MPI_Comm_free(&dup);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  const char* arg = argc > 1 ? argv[1] : "";
  const int mode = !strcmp(arg, "off")     ? 'o'
                   : !strcmp(arg, "learn") ? 'l'
                   : !strcmp(arg, "on")    ? 'n'
                                           : 0;
  CHECK(mode != 0 && (mode != 'l' || argc > 2), "usage: mpi_allreduce on|learn N|off");
  if (mode == 'l') exactCalls_ = atol(argv[2]);
  gradients(mode);
  if (mode != 'l') communicators(mode);
  if (rank_ == 0) printf("mpi_allreduce %s: ok on %d ranks\n", argv[1], size_);
  MPI_Finalize();
  return 0;
}
