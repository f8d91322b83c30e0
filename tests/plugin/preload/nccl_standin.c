/* A stand-in libnccl.so.2 for testing the interposer's NCCL front end on a
 * machine without a GPU: communicators are plain records, ncclAllReduce copies
 * its input and logs its arguments, so the test can check that every call it
 * made arrived unchanged. Only the entry points the interposer resolves.
 *
 * ncclReduceScatter gives each rank its own piece of the input the same way,
 * and ncclAllGather puts the input at the rank's piece of the output.
 * Built as NCCL 2.32.3 (with ncclAllReduceConfig and
 * ncclReduceScatterConfig), or with -DSTANDIN_NCCL_VERSION=23007 as NCCL
 * 2.30.7, which lacks them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* A communicator made inside a group, or a non-blocking one (by its
 * config, NCCL_COMM_BLOCKING=0, or standinNonBlocking(1)), is not ready until
 * the group ends or the test says so; NCCL refuses queries and collectives on
 * it until then. A revoked or suspended one refuses collectives. */
typedef struct {
  int nranks, rank, ready, nonBlocking, revoked, suspended;
} Comm;
typedef struct {
  char internal[128];
} UniqueId;
/* The head of ncclConfig_t (NCCL 2.14 and later). */
typedef struct {
  size_t size;
  unsigned magic, version;
  int blocking;
} ConfigHead;

/* A call as it arrived; `viaConfig`: through ncclAllReduceConfig (or
 * ncclReduceScatterConfig), with `config`; `scatter`: a reduce-scatter, whose
 * `count` is its recvcount. */
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

#ifndef STANDIN_NCCL_VERSION
#define STANDIN_NCCL_VERSION 23203
#endif
EXPORT int ncclGetVersion(int* version) {
  *version = STANDIN_NCCL_VERSION;
  return 0;
}

static Logged log_[256];
static int logged_, groupStarts_, groupEnds_, groupDepth_, nonBlocking_, nInGroup_;
static Comm* inGroup_[64];

static size_t typeBytes(int t) {
  return t <= 1 ? 1 : t == 6 || t == 9 ? 2 : t == 4 || t == 5 || t == 8 ? 8 : 4;
}

/* A non-blocking communicator's collective returns ncclInProgress (7): NCCL
 * finishes it in the background. */
static int collective(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                      void* stream, int viaConfig, const void* config, int scatter) {
  const Comm* c = comm;
  if (!c->ready) return 5; /* ncclInvalidUsage */
  if (logged_ < 256)
    log_[logged_++] =
        (Logged){send, recv, count, dtype, op, comm, stream, viaConfig, config, scatter};
  if (c->revoked || c->suspended) return 5;
  const size_t piece = (size_t)c->rank * count * typeBytes(dtype);
  const char* from = (const char*)send + (scatter == 1 ? piece : 0);
  char* to = (char*)recv + (scatter == 2 ? piece : 0);
  if (from != to) memcpy(to, from, count * typeBytes(dtype));
  return c->nonBlocking ? 7 : 0;
}
static int allReduce(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                     void* stream, int viaConfig, const void* config) {
  return collective(send, recv, count, dtype, op, comm, stream, viaConfig, config, 0);
}
EXPORT int ncclAllGather(const void* send, void* recv, size_t sendcount, int dtype, void* comm,
                         void* stream) {
  return collective(send, recv, sendcount, dtype, 0, comm, stream, 0, NULL, 2);
}
EXPORT int ncclReduceScatter(const void* send, void* recv, size_t recvcount, int dtype, int op,
                             void* comm, void* stream) {
  return collective(send, recv, recvcount, dtype, op, comm, stream, 0, NULL, 1);
}
EXPORT int ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                         void* stream) {
  return allReduce(send, recv, count, dtype, op, comm, stream, 0, NULL);
}
#if STANDIN_NCCL_VERSION >= 23100
/* NCCL 2.31+: a config without NCCL's magic is refused, after the call is
 * logged (ncclInvalidArgument); no config is the plain call. */
EXPORT int ncclAllReduceConfig(const void* send, void* recv, size_t count, int dtype, int op,
                               void* comm, void* stream, const void* config) {
  const ConfigHead* h = config;
  const int r = allReduce(send, recv, count, dtype, op, comm, stream, 1, config);
  return h != NULL && h->magic != 0xcafebeefu ? 4 : r;
}
EXPORT int ncclAllGatherConfig(const void* send, void* recv, size_t sendcount, int dtype,
                               void* comm, void* stream, const void* config) {
  const ConfigHead* h = config;
  const int r = collective(send, recv, sendcount, dtype, 0, comm, stream, 1, config, 2);
  return h != NULL && h->magic != 0xcafebeefu ? 4 : r;
}
EXPORT int ncclReduceScatterConfig(const void* send, void* recv, size_t recvcount, int dtype,
                                   int op, void* comm, void* stream, const void* config) {
  const ConfigHead* h = config;
  const int r = collective(send, recv, recvcount, dtype, op, comm, stream, 1, config, 1);
  return h != NULL && h->magic != 0xcafebeefu ? 4 : r;
}
#endif
/* NCCL's rule: NCCL_COMM_BLOCKING (0 or 1) first, then the config's
 * blocking (configs of NCCL 2.14 on), then, given no config, the parent's;
 * else blocking. */
static int nonBlockingOf(const void* config, const Comm* parent) {
  const char* env = getenv("NCCL_COMM_BLOCKING");
  if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0)) return env[0] == '0';
  if (config != NULL) {
    const ConfigHead* h = config;
    return h->magic == 0xcafebeefu && h->version >= 21400 && h->blocking == 0;
  }
  return parent != NULL ? parent->nonBlocking : nonBlocking_;
}
static int make(void** comm, int nranks, int rank, int nonBlocking) {
  Comm* c = calloc(1, sizeof(Comm));
  c->nranks = nranks;
  c->rank = rank;
  c->nonBlocking = nonBlocking;
  c->ready = groupDepth_ == 0 && !nonBlocking;
  if (groupDepth_ > 0 && nInGroup_ < 64) inGroup_[nInGroup_++] = c;
  *comm = c;
  return nonBlocking ? 7 : 0; /* ncclInProgress */
}
EXPORT int ncclCommInitRank(void** comm, int nranks, UniqueId id, int rank) {
  (void)id;
  return make(comm, nranks, rank, nonBlockingOf(NULL, NULL));
}
EXPORT int ncclCommInitRankConfig(void** comm, int nranks, UniqueId id, int rank, void* config) {
  (void)id;
  return make(comm, nranks, rank, nonBlockingOf(config, NULL));
}
EXPORT int ncclCommInitAll(void** comms, int ndev, const int* devs) {
  (void)devs;
  for (int i = 0; i < ndev; ++i) make(&comms[i], ndev, i, 0);
  return 0;
}
EXPORT int ncclCommSplit(void* comm, int color, int key, void** out, void* config) {
  (void)color;
  const Comm* c = comm;
  return make(out, c->nranks, key % c->nranks, nonBlockingOf(config, c));
}
EXPORT int ncclCommInitRankScalable(void** comm, int nranks, int rank, int nIds, UniqueId* ids,
                                    void* config) {
  (void)nIds;
  (void)ids;
  return make(comm, nranks, rank, nonBlockingOf(config, NULL));
}
EXPORT int ncclCommShrink(void* comm, int* exclude, int nExclude, void** out, void* config,
                          int flags) {
  (void)exclude;
  (void)flags;
  const Comm* c = comm;
  return make(out, c->nranks - nExclude, 0, nonBlockingOf(config, c));
}
/* Existing ranks pass their communicator and rank -1, joining ones NULL and
 * their new rank. */
EXPORT int ncclCommGrow(void* comm, int nranks, const UniqueId* id, int rank, void** out,
                        void* config) {
  (void)id;
  const Comm* c = comm;
  if (out == NULL || (c != NULL && (rank != -1 || nranks <= c->nranks))) return 4;
  return make(out, nranks, c != NULL ? c->rank : rank, nonBlockingOf(config, c));
}
EXPORT int ncclCommRevoke(void* comm, int flags) {
  if (flags != 0) return 4; /* ncclInvalidArgument */
  ((Comm*)comm)->revoked = 1;
  return 0;
}
EXPORT int ncclCommSuspend(void* comm, int flags) {
  (void)flags;
  ((Comm*)comm)->suspended = 1;
  return 0;
}
EXPORT int ncclCommResume(void* comm) {
  ((Comm*)comm)->suspended = 0;
  return 0;
}
EXPORT int ncclCommDestroy(void* comm) {
  free(comm);
  return 0;
}
static int probeAbort_;
EXPORT int ncclCommAbort(void* comm) {
  /* The probe: an eligible allreduce on the communicator being aborted, made
   * through whatever ncclAllReduce the process resolves (the interposer's),
   * tells the test's report whether the interposer still tracked the
   * communicator when NCCL's abort ran (it must: the state is dropped after). */
  if (probeAbort_) {
    static float probe[4096];
    int (*allReduce)(const void*, void*, size_t, int, int, void*, void*) = NULL;
    void* symbol = dlsym(RTLD_DEFAULT, "ncclAllReduce");
    memcpy(&allReduce, &symbol,
           sizeof symbol); /* POSIX's way round ISO C's object/function split */
    if (allReduce != NULL) allReduce(probe, probe, 4096, 7, 0, comm, NULL);
  }
  free(comm);
  return 0;
}
EXPORT int ncclGroupStart(void) {
  ++groupStarts_;
  ++groupDepth_;
  return 0;
}
static int endGroup(void) {
  if (groupDepth_ > 0 && --groupDepth_ == 0) {
    for (int i = 0; i < nInGroup_; ++i) inGroup_[i]->ready = 1;
    nInGroup_ = 0;
  }
  return 0;
}
EXPORT int ncclGroupEnd(void) {
  ++groupEnds_;
  return endGroup();
}
/* Ends the group as ncclGroupEnd does, launching nothing. (Not through
 * ncclGroupEnd: that call would bind to the interposer's.) */
EXPORT int ncclGroupSimulateEnd(void* simInfo) {
  (void)simInfo;
  --groupStarts_;
  return endGroup();
}
EXPORT int ncclCommCount(void* comm, int* n) {
  if (!((Comm*)comm)->ready) return 4; /* ncclInvalidArgument, as NCCL 2.28 */
  *n = ((Comm*)comm)->nranks;
  return 0;
}
EXPORT int ncclCommUserRank(void* comm, int* r) {
  if (!((Comm*)comm)->ready) return 4;
  *r = ((Comm*)comm)->rank;
  return 0;
}
EXPORT int ncclCommGetAsyncError(void* comm, int* state) {
  *state = ((Comm*)comm)->ready ? 0 : 7;
  return 0;
}

/* For the test only (not NCCL API): a communicator made behind the
 * interposer's back, and the log. */
EXPORT int standinMakeComm(void** comm, int nranks) { return make(comm, nranks, 0, 0); }
EXPORT int standinLogged(void) { return logged_; }
EXPORT const Logged* standinCall(int i) { return &log_[i]; }
EXPORT void standinProbeAbort(int on) { probeAbort_ = on; }
EXPORT void standinNonBlocking(int on) { nonBlocking_ = on; }
EXPORT void standinReady(void* comm) { ((Comm*)comm)->ready = 1; }
EXPORT int standinGroups(void) { return groupStarts_ * 1000 + groupEnds_; }
