/* The interposer's NCCL front end against the stand-in libnccl.so.2, on the
 * CPU: which communicators it tracks, what it passes through and why. Without
 * CUDA the compressed path cannot run, so eligible calls must reach the
 * stand-in too, reported as "no_engine"; what the compressed path does on a
 * device is covered by tests/gpu/run.sh (and its stream ordering and deferred
 * frees by the emulated tests in tests/gpu).
 *
 * Child processes make the calls under LD_PRELOAD (each writes its report at
 * exit); the parent then checks the reports' reasons. One child per
 * environment: the main one, one with NCCL_COMM_BLOCKING=0, and one with a
 * warmup whose first calls are captured into a CUDA graph, and the
 * reduce-scatter's (ncclReduceScatter and ncclReduceScatterConfig) by default
 * and with SQUALL_PRELOAD_COLLECTIVES=allreduce. With the argument nccl-2.30
 * (and the NCCL 2.30.7 stand-in first on LD_LIBRARY_PATH), one child checks
 * that ncclAllReduceConfig and ncclReduceScatterConfig, which that NCCL
 * lacks, fail. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  char internal[128];
} UniqueId;
typedef struct {
  const void* send;
  void* recv;
  size_t count;
  int dtype, op;
  void* comm;
  void* stream;
  int viaConfig;
  const void* config;
  int scatter;
} Logged;

int ncclAllReduce(const void*, void*, size_t, int, int, void*, void*);
int ncclAllReduceConfig(const void*, void*, size_t, int, int, void*, void*, const void*);
int ncclReduceScatter(const void*, void*, size_t, int, int, void*, void*);
int ncclAllGather(const void*, void*, size_t, int, void*, void*);
int ncclAllGatherConfig(const void*, void*, size_t, int, void*, void*, const void*);
int ncclReduceScatterConfig(const void*, void*, size_t, int, int, void*, void*, const void*);
int ncclGetVersion(int*);
int ncclCommInitRank(void**, int, UniqueId, int);
int ncclCommInitRankConfig(void**, int, UniqueId, int, void*);
int ncclCommSplit(void*, int, int, void**, void*);
int ncclCommInitRankScalable(void**, int, int, int, UniqueId*, void*);
int ncclCommShrink(void*, int*, int, void**, void*, int);
int ncclGroupSimulateEnd(void*);
int ncclCommDestroy(void*);
int ncclCommAbort(void*);
int ncclCommGrow(void*, int, const UniqueId*, int, void**, void*);
int ncclCommRevoke(void*, int);
int ncclCommSuspend(void*, int);
int ncclCommResume(void*);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int standinMakeComm(void**, int);
int standinLogged(void);
const Logged* standinCall(int);
int standinGroups(void);
void standinProbeAbort(int);
void standinNonBlocking(int);
void standinReady(void*);

enum { kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9, kInt32 = 2 };
enum { kSum = 0, kMax = 2, kAvg = 4, kPreMulSum = 5 };
enum { kSuccess = 0, kInvalidArgument = 4, kInvalidUsage = 5, kInProgress = 7 };

/* The head of ncclConfig_t as NCCL_CONFIG_INITIALIZER fills it (NCCL 2.30),
 * with `blocking` set; the rest of the struct is never read. */
typedef struct {
  size_t size;
  unsigned magic, version;
  int blocking;
  char rest[128];
} Config;
static Config config(int blocking, unsigned version) {
  Config c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  c.magic = 0xcafebeefu;
  c.version = version;
  c.blocking = blocking;
  return c;
}

/* The per-call config of ncclAllReduceConfig as NCCL 2.32 lays it out:
 * size, magic, version, vendor options, least and most CTAs, the NVLS CTA
 * cap, the cluster size, an algorithm filter and whether it must be met, a
 * CTA policy, a profiler tag and a launch event. */
typedef struct {
  size_t size;
  unsigned magic, version;
  void* vendorOptions;
  int minCtas, maxCtas, nvlsCtas, clusterSize;
  const char* algorithms;
  int algorithmsRequired, ctaPolicy;
  unsigned long long profilerTag;
  void* launchedEvent;
} CollConfig;
_Static_assert(sizeof(CollConfig) == 72, "the 2.32 layout");
/* Every member as NCCL's initializer leaves it: ints unset (INT_MIN),
 * pointers null, the filter required, no profiler tag. */
static CollConfig collConfig(void) {
  CollConfig c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  c.magic = 0xcafebeefu;
  c.version = 23203;
  c.minCtas = c.maxCtas = c.nvlsCtas = c.clusterSize = c.ctaPolicy = INT_MIN;
  c.algorithmsRequired = 1;
  return c;
}

/* The CUDA runtime's capture query, as the interposer finds it among the
 * process's global symbols: the stream `captured_` is being captured. */
static void* captured_;
__attribute__((visibility("default"))) int cudaStreamIsCapturing(void* stream, int* status) {
  *status = stream != NULL && stream == captured_; /* cudaStreamCaptureStatusActive */
  return 0;
}

static float buf[16384], out[16384];
static int made_;

#define CHECK(cond, ...)                         \
  do {                                           \
    if (!(cond)) {                               \
      fprintf(stderr, "FAILED: " __VA_ARGS__);   \
      fprintf(stderr, " (line %d)\n", __LINE__); \
      exit(1);                                   \
    }                                            \
  } while (0)

/* A call on `stream` whose real NCCL answers `want`, which must come back
 * unchanged, made through ncclAllReduce or, `viaConfig`, through
 * ncclAllReduceConfig with `config`: it must reach the same entry point. */
static void callVia(int viaConfig, const CollConfig* config, size_t count, int dtype, int op,
                    void* comm, void* stream, int want) {
  const int r = viaConfig ? ncclAllReduceConfig(buf, out, count, dtype, op, comm, stream, config)
                          : ncclAllReduce(buf, out, count, dtype, op, comm, stream);
  CHECK(r == want, "call %d returned %d, not %d", made_, r, want);
  CHECK(standinLogged() == made_ + 1, "call %d did not reach NCCL", made_);
  const Logged* l = standinCall(made_);
  CHECK(l->send == buf && l->recv == out && l->count == count && l->dtype == dtype && l->op == op &&
            l->comm == comm && l->stream == stream && l->viaConfig == viaConfig &&
            l->config == (const void*)config && !l->scatter,
        "call %d reached NCCL with other arguments", made_);
  ++made_;
}
/* The same for a reduce-scatter of recvcount elements per rank, through
 * ncclReduceScatter or, `viaConfig`, ncclReduceScatterConfig. */
static void scatterVia(int viaConfig, const CollConfig* config, size_t recvcount, int dtype, int op,
                       void* comm, int want) {
  void* stream = (void*)(size_t)(0x2000 + made_);
  const int r = viaConfig
                    ? ncclReduceScatterConfig(buf, out, recvcount, dtype, op, comm, stream, config)
                    : ncclReduceScatter(buf, out, recvcount, dtype, op, comm, stream);
  CHECK(r == want, "reduce-scatter %d returned %d, not %d", made_, r, want);
  CHECK(standinLogged() == made_ + 1, "reduce-scatter %d did not reach NCCL", made_);
  const Logged* l = standinCall(made_);
  CHECK(l->send == buf && l->recv == out && l->count == recvcount && l->dtype == dtype &&
            l->op == op && l->comm == comm && l->stream == stream && l->viaConfig == viaConfig &&
            l->config == (const void*)config && l->scatter == 1,
        "reduce-scatter %d reached NCCL with other arguments", made_);
  ++made_;
}
/* An all-gather of sendcount elements per rank, through ncclAllGather or,
 * `viaConfig`, ncclAllGatherConfig. */
static void gatherVia(int viaConfig, const CollConfig* config, size_t sendcount, int dtype,
                      void* comm) {
  void* stream = (void*)(size_t)(0x3000 + made_);
  const int r = viaConfig ? ncclAllGatherConfig(buf, out, sendcount, dtype, comm, stream, config)
                          : ncclAllGather(buf, out, sendcount, dtype, comm, stream);
  CHECK(r == kSuccess, "all-gather %d returned %d", made_, r);
  CHECK(standinLogged() == made_ + 1, "all-gather %d did not reach NCCL", made_);
  const Logged* l = standinCall(made_);
  CHECK(l->send == buf && l->recv == out && l->count == sendcount && l->dtype == dtype &&
            l->comm == comm && l->stream == stream && l->viaConfig == viaConfig &&
            l->config == (const void*)config && l->scatter == 2,
        "all-gather %d reached NCCL with other arguments", made_);
  ++made_;
}
static void scatter(size_t recvcount, int dtype, int op, void* comm) {
  scatterVia(0, NULL, recvcount, dtype, op, comm, kSuccess);
}
static void callOn(size_t count, int dtype, int op, void* comm, void* stream, int want) {
  callVia(0, NULL, count, dtype, op, comm, stream, want);
}
static void callConfig(const CollConfig* config, size_t count, void* comm, int want) {
  callVia(1, config, count, kFloat32, kSum, comm, (void*)(size_t)(0x1000 + made_), want);
}
static void call(size_t count, int dtype, int op, void* comm) {
  callOn(count, dtype, op, comm, (void*)(size_t)(0x1000 + made_), kSuccess);
}
static void callExpect(void* comm, int want) {
  callOn(4096, kFloat32, kSum, comm, (void*)(size_t)(0x1000 + made_), want);
}

/* torch's watchdog aborts from its own thread, inside a group. */
static void* abortInGroup(void* comm) {
  CHECK(ncclGroupStart() == 0 && ncclCommAbort(comm) == 0 && ncclGroupEnd() == 0,
        "abort in a group");
  return NULL;
}

/* Non-blocking communicators pass through (their calls return before NCCL
 * has finished them, which the compressed path does not do), known from the
 * config, and a split given no config inherits its parent's. */
static void nonBlocking(UniqueId id) {
  void *cn, *inherit, *blocking, *old;
  Config nb = config(0, 23007), blk = config(1, 23007), ancient = config(0, 21300);
  CHECK(ncclCommInitRankConfig(&cn, 2, id, 0, (void*)&nb) == kInProgress, "non-blocking init");
  standinReady(cn);
  callExpect(cn, kInProgress); /* nonblocking */
  CHECK(ncclCommSplit(cn, 0, 0, &inherit, NULL) == kInProgress, "split");
  standinReady(inherit);
  callExpect(inherit, kInProgress); /* nonblocking: the parent's config */
  CHECK(ncclCommSplit(cn, 0, 0, &blocking, (void*)&blk) == kSuccess, "blocking split");
  callExpect(blocking, kSuccess); /* eligible: its own config */
  /* NCCL ignores `blocking` in a config older than 2.14. */
  CHECK(ncclCommInitRankConfig(&old, 2, id, 1, (void*)&ancient) == kSuccess, "old config");
  callExpect(old, kSuccess); /* eligible */
  void* grown;
  CHECK(ncclCommGrow(cn, 3, NULL, -1, &grown, NULL) == kInProgress, "grow");
  standinReady(grown);
  callExpect(grown, kInProgress); /* nonblocking: the parent's config */
  CHECK(ncclCommDestroy(grown) == 0 && ncclCommDestroy(old) == 0 &&
            ncclCommDestroy(blocking) == 0 && ncclCommDestroy(inherit) == 0 &&
            ncclCommDestroy(cn) == 0,
        "destroy");
}

/* ncclAllReduceConfig: no config, and a config left at NCCL's defaults, go
 * where the plain call goes (no_engine here, compressed on a GPU) with the
 * plain call's result; a config that asks for anything else passes through
 * as coll_config, counted by what it sets, and NCCL's answer comes back.
 * Either way the call reaches NCCL's ncclAllReduceConfig, config and all. */
static void collConfigs(void* comm, void* untracked) {
  static float plain[4096];
  for (int i = 0; i < 4096; ++i) buf[i] = (float)i * 0.25f - 100.0f;
  call(4096, kFloat32, kSum, comm); /* eligible */
  memcpy(plain, out, sizeof plain);
  CollConfig unset = collConfig(), noFilter = collConfig(), unrequired = collConfig();
  noFilter.algorithms = "";          /* an empty filter is none */
  unrequired.algorithmsRequired = 0; /* says nothing without a filter */
  const CollConfig* honoured[] = {NULL, &unset, &noFilter, &unrequired};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4096; ++j) out[j] = -1.0f;
    callConfig(honoured[i], 4096, comm, kSuccess); /* eligible */
    CHECK(memcmp(out, plain, sizeof plain) == 0, "config %d: not the plain call's result", i);
  }
  static int vendorOption;
  CollConfig filter = collConfig(), ctas = collConfig(), tag = collConfig(), vendor = collConfig(),
             magic = collConfig(), newer = collConfig();
  filter.algorithms = "ring";
  ctas.maxCtas = 4;
  tag.profilerTag = 42;
  vendor.vendorOptions = &vendorOption;
  magic.magic = 0xbadu;
  newer.size = sizeof newer + 8; /* a later NCCL's, with members appended */

  callConfig(&filter, 4096, comm, kSuccess);        /* coll_config: algSelection */
  callConfig(&ctas, 4096, comm, kSuccess);          /* coll_config: maxCTAs */
  callConfig(&tag, 4096, comm, kSuccess);           /* coll_config: userProfilerTag */
  callConfig(&vendor, 4096, comm, kSuccess);        /* coll_config: ext */
  callConfig(&magic, 4096, comm, kInvalidArgument); /* coll_config: magic; NCCL refuses it */
  callConfig(&newer, 4096, comm, kSuccess);         /* coll_config: size */
  /* Calls that pass through anyway keep their own reason. */
  callConfig(&filter, 100, comm, kSuccess);       /* small */
  callConfig(&filter, 4096, untracked, kSuccess); /* communicator */
}

/* Both sides of a grow get the grown communicator, tracked. */
static void grow(void* a, UniqueId id) {
  void *existing, *joining;
  CHECK(ncclCommGrow(a, 3, NULL, -1, &existing, NULL) == 0, "grow, existing rank");
  CHECK(ncclCommGrow(NULL, 3, &id, 2, &joining, NULL) == 0, "grow, joining rank");
  call(4096, kFloat32, kSum, existing); /* eligible */
  call(4096, kFloat32, kSum, joining);  /* eligible */
  CHECK(ncclCommDestroy(existing) == 0 && ncclCommDestroy(joining) == 0, "destroy");
}

/* A revoked communicator passes through until destroyed; a suspended one
 * until resumed. An abort from another thread inside a group. */
static void revokeAndSuspend(UniqueId id) {
  void *rv, *sp, *ab;
  CHECK(ncclCommInitRank(&rv, 2, id, 0) == 0 && ncclCommInitRank(&sp, 2, id, 1) == 0 &&
            ncclCommInitRank(&ab, 2, id, 0) == 0,
        "init");
  callExpect(rv, kSuccess); /* eligible */
  CHECK(ncclCommRevoke(rv, 0) == 0, "revoke");
  callExpect(rv, kInvalidUsage); /* revoked: NCCL refuses it, and says so */
  CHECK(ncclCommDestroy(rv) == 0, "destroy");
  CHECK(ncclCommSuspend(sp, 1) == 0, "suspend");
  callExpect(sp, kInvalidUsage); /* suspended */
  CHECK(ncclCommResume(sp) == 0, "resume");
  callExpect(sp, kSuccess); /* eligible */
  CHECK(ncclCommDestroy(sp) == 0, "destroy");
  pthread_t watchdog;
  CHECK(pthread_create(&watchdog, NULL, abortInGroup, ab) == 0, "thread");
  CHECK(pthread_join(watchdog, NULL) == 0, "join");
}

static int child(void) {
  UniqueId id;
  memset(&id, 0, sizeof id);
  void *a, *b, *c, *one, *untracked, *nb, *g, *gs, *sc, *sh;
  CHECK(ncclCommInitRank(&a, 2, id, 0) == 0, "init");
  CHECK(ncclCommInitRankConfig(&b, 1, id, 0, NULL) == 0, "init config");
  CHECK(ncclCommSplit(a, 0, 1, &c, NULL) == 0, "split");
  CHECK(standinMakeComm(&untracked, 2) == 0, "stand-in comm");
  one = b;
  call(4096, kFloat32, kSum, a);       /* eligible: no engine without CUDA */
  call(4096, kFloat32, kSum, a);       /* eligible */
  call(4096, kFloat32, kAvg, a);       /* eligible */
  call(8192, kBfloat16, kSum, a);      /* eligible */
  call(8192, kFloat16, kAvg, a);       /* eligible */
  call(4096, kFloat32, kMax, a);       /* op */
  call(4096, kFloat32, kPreMulSum, a); /* op: ncclRedOpCreatePreMulSum's */
  call(4096, kInt32, kSum, a);         /* dtype */
  call(2048, kFloat64, kSum, a);       /* dtype */
  call(100, kFloat32, kSum, a);        /* small */
  CHECK(ncclGroupStart() == 0, "group");
  call(4096, kFloat32, kSum, a); /* group */
  CHECK(ncclGroupStart() == 0, "nested group");
  call(4096, kFloat32, kSum, c); /* group */
  CHECK(ncclGroupEnd() == 0, "nested group end");
  CHECK(ncclGroupEnd() == 0, "group end");
  CHECK(standinGroups() == 2002, "group calls did not all reach NCCL");
  call(4096, kFloat32, kSum, c);         /* eligible: the split is tracked */
  call(4096, kFloat32, kSum, untracked); /* communicator: not made through the interposer */
  call(4096, kFloat32, kSum, one);       /* communicator: one rank */
  /* Communicators handed out before they are ready: a non-blocking init
   * (ncclInProgress), and an init and a split inside a group. NCCL refuses
   * ncclCommCount on them until then; the interposer learns their size at
   * their first collective. */
  standinNonBlocking(1);
  CHECK(ncclCommInitRankConfig(&nb, 2, id, 0, NULL) == 7, "non-blocking init");
  standinNonBlocking(0);
  CHECK(ncclGroupStart() == 0, "group");
  CHECK(ncclCommInitRank(&g, 2, id, 0) == 0, "init in a group");
  CHECK(ncclCommSplit(a, 0, 1, &gs, NULL) == 0, "split in a group");
  CHECK(ncclGroupEnd() == 0, "group end");
  standinReady(nb);
  callExpect(nb, kInProgress);    /* nonblocking: NCCL's answer comes back */
  call(4096, kFloat32, kSum, g);  /* eligible */
  call(4096, kFloat32, kSum, gs); /* eligible */
  CHECK(ncclCommDestroy(nb) == 0 && ncclCommDestroy(g) == 0 && ncclCommDestroy(gs) == 0, "destroy");
  /* torch's init above TORCH_NCCL_RANKS_PER_ROOT ranks, and a shrink. */
  UniqueId ids[2];
  memset(ids, 0, sizeof ids);
  int excluded = 1;
  CHECK(ncclCommInitRankScalable(&sc, 2, 1, 2, ids, NULL) == 0, "scalable init");
  CHECK(ncclCommShrink(a, &excluded, 1, &sh, NULL, 0) == 0, "shrink");
  call(4096, kFloat32, kSum, sc); /* eligible */
  call(4096, kFloat32, kSum, sh); /* communicator: one rank left */
  CHECK(ncclCommDestroy(sc) == 0 && ncclCommDestroy(sh) == 0, "destroy");
  /* A simulated group end closes the group like ncclGroupEnd. */
  char simInfo[32] = {0};
  CHECK(ncclGroupStart() == 0 && ncclGroupSimulateEnd(simInfo) == 0, "simulated group");
  call(4096, kFloat32, kSum, a); /* eligible, not group */
  CHECK(ncclCommDestroy(a) == 0, "destroy");
  /* The stand-in's abort probes, through the interposer, whether `c` is still
   * tracked while NCCL aborts it: eligible (no_engine), not communicator. */
  standinProbeAbort(1);
  CHECK(ncclCommAbort(c) == 0, "abort");
  standinProbeAbort(0);
  made_ = standinLogged();
  /* A new communicator, perhaps at a freed one's address, starts afresh. */
  CHECK(ncclCommInitRank(&a, 2, id, 1) == 0, "init again");
  call(4096, kFloat32, kSum, a); /* eligible */
  collConfigs(a, untracked);
  CHECK(ncclCommDestroy(b) == 0, "destroy");
  nonBlocking(id);
  grow(a, id);
  revokeAndSuspend(id);
  CHECK(ncclCommDestroy(a) == 0, "destroy");
  return 0;
}

/* Reduce-scatters (FSDP's gradients): judged by their whole input (n x
 * recvcount), placed in steps of their own, passed through for the same
 * reasons as allreduces and, under SQUALL_PRELOAD_COLLECTIVES=allreduce, as
 * `collective`; the report counts them apart. */
static int childScatter(void) {
  UniqueId id;
  memset(&id, 0, sizeof id);
  void *a, *one, *untracked;
  CHECK(ncclCommInitRank(&a, 2, id, 1) == 0, "init");
  CHECK(ncclCommInitRank(&one, 1, id, 0) == 0, "init");
  CHECK(standinMakeComm(&untracked, 2) == 0, "stand-in comm");
  for (int i = 0; i < 8192; ++i) buf[i] = (float)i;
  scatter(2048, kFloat32, kSum, a); /* eligible: no engine without CUDA */
  CHECK(out[0] == 2048.0f && out[2047] == 4095.0f, "not rank 1's piece");
  scatter(2048, kFloat32, kAvg, a);  /* eligible */
  scatter(4096, kBfloat16, kAvg, a); /* eligible */
  scatter(600, kFloat32, kSum, a);   /* eligible: 4800 bytes in, 2400 out */
  scatter(400, kFloat32, kSum, a);   /* small */
  scatter(2048, kFloat32, kMax, a);  /* op */
  scatter(2048, kInt32, kSum, a);    /* dtype */
  CHECK(ncclGroupStart() == 0, "group");
  scatter(2048, kFloat32, kSum, a); /* group */
  CHECK(ncclGroupEnd() == 0, "group end");
  scatter(2048, kFloat32, kSum, untracked); /* communicator */
  scatter(4096, kFloat32, kSum, one);       /* communicator: one rank */
  CollConfig unset = collConfig(), tag = collConfig();
  tag.profilerTag = 7;
  scatterVia(1, NULL, 2048, kFloat32, kSum, a, kSuccess);   /* eligible */
  scatterVia(1, &unset, 2048, kFloat32, kSum, a, kSuccess); /* eligible */
  scatterVia(1, &tag, 2048, kFloat32, kSum, a, kSuccess);   /* coll_config: userProfilerTag */
  call(4096, kFloat32, kSum, a);                            /* an allreduce: eligible */
  /* All-gathers: `collective` unless SQUALL_PRELOAD_COLLECTIVES lists
   * all_gather; then judged by the output's size. */
  gatherVia(0, NULL, 1024, kFloat32, a); /* eligible with all_gather: 8192 bytes out */
  CHECK(out[1024] == buf[0], "not at rank 1's piece");
  gatherVia(1, &unset, 1024, kBfloat16, a); /* eligible with all_gather */
  gatherVia(0, NULL, 300, kFloat32, a);     /* small with all_gather: 2400 bytes out */
  gatherVia(0, NULL, 1024, kInt32, a);      /* dtype with all_gather */
  CHECK(ncclCommDestroy(a) == 0 && ncclCommDestroy(one) == 0, "destroy");
  return 0;
}

/* NCCL_COMM_BLOCKING=0 makes every communicator non-blocking, whatever its
 * config says. */
static int childEnvNonBlocking(void) {
  UniqueId id;
  memset(&id, 0, sizeof id);
  void *a, *b;
  Config blk = config(1, 23007);
  CHECK(ncclCommInitRank(&a, 2, id, 0) == kInProgress, "init");
  CHECK(ncclCommInitRankConfig(&b, 2, id, 1, (void*)&blk) == kInProgress, "init config");
  standinReady(a);
  standinReady(b);
  callExpect(a, kInProgress); /* nonblocking */
  callExpect(b, kInProgress); /* nonblocking */
  CHECK(ncclCommDestroy(a) == 0 && ncclCommDestroy(b) == 0, "destroy");
  return 0;
}

/* Calls on a stream being captured pass through and leave the warmup (2
 * calls here) alone: the replays of the graph never come back here. */
static int childCapture(void) {
  UniqueId id;
  memset(&id, 0, sizeof id);
  void *a, *untracked;
  CHECK(ncclCommInitRank(&a, 2, id, 0) == 0, "init");
  CHECK(standinMakeComm(&untracked, 2) == 0, "stand-in comm");
  void* graphStream = (void*)(size_t)0xca97;
  captured_ = graphStream;
  callOn(4096, kFloat32, kSum, a, graphStream, kSuccess);         /* capture */
  callOn(100, kFloat32, kSum, a, graphStream, kSuccess);          /* capture (small) */
  callOn(4096, kFloat32, kSum, untracked, graphStream, kSuccess); /* communicator */
  callOn(4096, kFloat32, kSum, a, graphStream, kSuccess);         /* capture */
  captured_ = NULL;
  call(4096, kFloat32, kSum, a); /* warmup */
  call(4096, kFloat32, kSum, a); /* warmup */
  call(4096, kFloat32, kSum, a); /* eligible */
  CHECK(ncclCommDestroy(a) == 0, "destroy");
  return 0;
}

/* Against NCCL 2.30.7, which has no ncclAllReduceConfig, the interposer's
 * fails without reaching NCCL; the plain call is unaffected. */
static int childNccl230(void) {
  int version = 0;
  CHECK(ncclGetVersion(&version) == kSuccess && version == 23007,
        "not the NCCL 2.30.7 stand-in (version %d): is it first on LD_LIBRARY_PATH?", version);
  UniqueId id;
  memset(&id, 0, sizeof id);
  void* a;
  CHECK(ncclCommInitRank(&a, 2, id, 0) == 0, "init");
  CollConfig unset = collConfig();
  CHECK(ncclAllReduceConfig(buf, out, 4096, kFloat32, kSum, a, NULL, NULL) == kInvalidUsage &&
            ncclAllReduceConfig(buf, out, 4096, kFloat32, kSum, a, NULL, &unset) == kInvalidUsage,
        "ncclAllReduceConfig did not fail");
  CHECK(ncclReduceScatterConfig(buf, out, 2048, kFloat32, kSum, a, NULL, NULL) == kInvalidUsage,
        "ncclReduceScatterConfig did not fail");
  CHECK(ncclAllGatherConfig(buf, out, 2048, kFloat32, a, NULL, NULL) == kInvalidUsage,
        "ncclAllGatherConfig did not fail");
  CHECK(standinLogged() == 0, "ncclAllReduceConfig or ncclReduceScatterConfig reached NCCL");
  call(4096, kFloat32, kSum, a); /* eligible */
  CHECK(ncclCommDestroy(a) == 0, "destroy");
  return 0;
}

/* Runs `body` in a child with the variable `name` (unless NULL) set to
 * `value`, under report rank `rank`, and checks that the report holds every
 * string of `expect`. */
static void runChild(int (*body)(void), const char* name, const char* value, int rank,
                     const char* const* expect, size_t nExpect) {
  char dir[] = "/tmp/squall-nccl-front-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char prefix[256], path[320], rankText[16];
  snprintf(prefix, sizeof prefix, "%s/report", dir);
  snprintf(rankText, sizeof rankText, "%d", rank);
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("SQUALL_PRELOAD_REPORT", prefix, 1);
    setenv("RANK", rankText, 1);
    if (name != NULL) setenv(name, value, 1);
    exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child of rank %d failed", rank);
  snprintf(path, sizeof path, "%s.%d.json", prefix, rank);
  FILE* f = fopen(path, "r");
  CHECK(f != NULL, "no report %s (is LD_PRELOAD set?)", path);
  char text[4096];
  const size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  remove(path);
  rmdir(dir);
  printf("%s", text);
  for (size_t i = 0; i < nExpect; ++i)
    CHECK(strstr(text, expect[i]) != NULL, "the report of rank %d lacks %s", rank, expect[i]);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "nccl-2.30") == 0) {
    static const char* const kOld[] = {"\"calls_passed\": 1", "\"no_engine\": 1",
                                       "\"coll_config\": 0", "\"rank\": 8"};
    runChild(childNccl230, NULL, NULL, 8, kOld, sizeof kOld / sizeof kOld[0]);
    printf("nccl_front (NCCL 2.30.7): ok\n");
    return 0;
  }
  static const char* const kMain[] = {"\"calls_compressed\": 0",
                                      "\"calls_passed\": 47",
                                      "\"no_engine\": 23",
                                      "\"op\": 2",
                                      "\"dtype\": 2",
                                      "\"small\": 2",
                                      "\"group\": 2",
                                      "\"communicator\": 4",
                                      "\"nonblocking\": 4",
                                      "\"revoked\": 1",
                                      "\"suspended\": 1",
                                      "\"capture\": 0",
                                      "\"coll_config\": 6",
                                      "\"magic\": 1",
                                      "\"size\": 1",
                                      "\"ext\": 1",
                                      "\"minCTAs\": 0",
                                      "\"maxCTAs\": 1",
                                      "\"algSelection\": 1",
                                      "\"CTAPolicy\": 0",
                                      "\"userProfilerTag\": 1",
                                      "\"launchCompletionEvent\": 0",
                                      "\"rank\": 5"};
  runChild(child, NULL, NULL, 5, kMain, sizeof kMain / sizeof kMain[0]);
  static const char* const kEnv[] = {"\"calls_passed\": 2", "\"nonblocking\": 2",
                                     "\"no_engine\": 0", "\"rank\": 6"};
  runChild(childEnvNonBlocking, "NCCL_COMM_BLOCKING", "0", 6, kEnv, sizeof kEnv / sizeof kEnv[0]);
  static const char* const kCapture[] = {"\"calls_passed\": 7", "\"capture\": 3",
                                         "\"warmup\": 2",       "\"no_engine\": 1",
                                         "\"communicator\": 1", "\"rank\": 7"};
  runChild(childCapture, "SQUALL_PRELOAD_WARMUP", "2", 7, kCapture,
           sizeof kCapture / sizeof kCapture[0]);
  static const char* const kScatter[] = {
      "\"calls_passed\": 18",
      "\"no_engine\": 7",
      "\"small\": 1",
      "\"op\": 1",
      "\"dtype\": 1",
      "\"group\": 1",
      "\"communicator\": 2",
      "\"coll_config\": 1",
      "\"collective\": 4",
      "\"allreduce\": {\"calls_compressed\": 0, \"calls_passed\": 1",
      "\"reduce_scatter\": {\"calls_compressed\": 0, \"calls_passed\": 13",
      "\"all_gather\": {\"calls_compressed\": 0, \"calls_passed\": 4",
      "\"rank\": 9"};
  runChild(childScatter, NULL, NULL, 9, kScatter, sizeof kScatter / sizeof kScatter[0]);
  static const char* const kAllreduceOnly[] = {
      "\"calls_passed\": 18", "\"no_engine\": 1", "\"collective\": 17",
      "\"reduce_scatter\": {\"calls_compressed\": 0, \"calls_passed\": 13", "\"rank\": 10"};
  runChild(childScatter, "SQUALL_PRELOAD_COLLECTIVES", "allreduce", 10, kAllreduceOnly,
           sizeof kAllreduceOnly / sizeof kAllreduceOnly[0]);
  static const char* const kWithGathers[] = {
      "\"calls_passed\": 18", "\"no_engine\": 9",
      "\"small\": 2",         "\"dtype\": 2",
      "\"collective\": 0",    "\"all_gather\": {\"calls_compressed\": 0, \"calls_passed\": 4",
      "\"rank\": 11"};
  runChild(childScatter, "SQUALL_PRELOAD_COLLECTIVES", "allreduce,reduce_scatter,all_gather", 11,
           kWithGathers, sizeof kWithGathers / sizeof kWithGathers[0]);
  printf("nccl_front: ok\n");
  return 0;
}
