/* The interposer's NCCL front end against the stand-in libnccl.so.2, on the
 * CPU: which communicators it tracks, what it passes through and why. Without
 * CUDA the compressed path cannot run, so eligible calls must reach the
 * stand-in too, reported as "no_engine"; what the compressed path does on a
 * device is covered by tests/gpu/run.sh.
 *
 * A child process makes the calls under LD_PRELOAD (its report is written at
 * exit); the parent then checks the report's reasons. */
#define _POSIX_C_SOURCE 200809L
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
} Logged;

int ncclAllReduce(const void*, void*, size_t, int, int, void*, void*);
int ncclCommInitRank(void**, int, UniqueId, int);
int ncclCommInitRankConfig(void**, int, UniqueId, int, void*);
int ncclCommSplit(void*, int, int, void**, void*);
int ncclCommInitRankScalable(void**, int, int, int, UniqueId*, void*);
int ncclCommShrink(void*, int*, int, void**, void*, int);
int ncclGroupSimulateEnd(void*);
int ncclCommDestroy(void*);
int ncclCommAbort(void*);
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

static void call(size_t count, int dtype, int op, void* comm) {
  void* stream = (void*)(size_t)(0x1000 + made_);
  CHECK(ncclAllReduce(buf, out, count, dtype, op, comm, stream) == 0, "ncclAllReduce");
  CHECK(standinLogged() == made_ + 1, "call %d did not reach NCCL", made_);
  const Logged* l = standinCall(made_);
  CHECK(l->send == buf && l->recv == out && l->count == count && l->dtype == dtype && l->op == op &&
            l->comm == comm && l->stream == stream,
        "call %d reached NCCL with other arguments", made_);
  ++made_;
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
  call(4096, kFloat32, kSum, nb); /* eligible */
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
  CHECK(ncclCommDestroy(a) == 0 && ncclCommDestroy(b) == 0, "destroy");
  return 0;
}

int main(void) {
  char dir[] = "/tmp/squall-nccl-front-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char prefix[256], path[320];
  snprintf(prefix, sizeof prefix, "%s/report", dir);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("SQUALL_PRELOAD_REPORT", prefix, 1);
    setenv("RANK", "5", 1);
    return child();
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed");
  snprintf(path, sizeof path, "%s.5.json", prefix);
  FILE* f = fopen(path, "r");
  CHECK(f != NULL, "no report %s (is LD_PRELOAD set?)", path);
  char text[4096];
  const size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  remove(path);
  rmdir(dir);
  printf("%s", text);
  const char* expect[] = {"\"calls_compressed\": 0",
                          "\"calls_passed\": 23",
                          "\"no_engine\": 13",
                          "\"op\": 2",
                          "\"dtype\": 2",
                          "\"small\": 1",
                          "\"group\": 2",
                          "\"communicator\": 3",
                          "\"rank\": 5"};
  for (size_t i = 0; i < sizeof expect / sizeof expect[0]; ++i)
    CHECK(strstr(text, expect[i]) != NULL, "the report lacks %s", expect[i]);
  printf("nccl_front: ok\n");
  return 0;
}
