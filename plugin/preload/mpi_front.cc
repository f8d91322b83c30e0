// The MPI front end: MPI_Allreduce of fp32 sums on intracommunicators runs as
// Squall's compressed allreduce; every other call goes to PMPI_Allreduce with
// its arguments unchanged.
//
// Per-communicator state hangs off the communicator as an MPI attribute, so it
// follows the communicator's life: MPI_Comm_dup does not copy it (a duplicate
// gets its own step and residuals), and MPI_Comm_free hands it to a list that
// the next call (or MPI_Finalize) destroys outside MPI's callback. An
// attribute on MPI_COMM_SELF, deleted first thing in MPI_Finalize while MPI
// still works, tears down every Squall communicator and writes the report.
//
// Calls may come from any thread (Horovod calls from its background thread,
// MPI_THREAD_MULTIPLE programs from several). A short lock guards the
// registry; each communicator's state has its own lock, held through its
// collective (MPI's rules already make that one at a time per communicator),
// so that threads reducing on different communicators never wait for each
// other: one lock for all would deadlock ranks whose threads enter two
// communicators in different orders.
#include <mpi.h>

#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "plugin/preload/compressors.h"
#include "plugin/preload/interposer.h"
#include "plugin/preload/real_mpi.h"
#include "plugin/preload/report.h"
#include "plugin/preload/residual_map.h"
#include "src/core/comm.h"

namespace squall::preload {
namespace {

struct CommState {
  explicit CommState(const Policy& p) : step(p) {}
  std::mutex mutex;                    // the fields below, and this communicator's compressed call
  std::unique_ptr<core::Comm> engine;  // outlives the compressors of `step`
  StepState step;
  bool engineFailed = false;
};

std::mutex gMutex;           // the registry: keyvals, gLive, gFinalized
std::mutex gGraveyardMutex;  // states of freed communicators, destroyed later
std::vector<CommState*> gGraveyard;
std::set<CommState*> gLive;
int gKeyval = MPI_KEYVAL_INVALID;
int gSelfKeyval = MPI_KEYVAL_INVALID;
bool gFinalized = false;

int forgetState(MPI_Comm, int, void* attribute, void*) {
  std::lock_guard<std::mutex> lock(gGraveyardMutex);
  gGraveyard.push_back(static_cast<CommState*>(attribute));
  return MPI_SUCCESS;
}

void drainGraveyard() {
  std::vector<CommState*> dead;
  {
    std::lock_guard<std::mutex> lock(gGraveyardMutex);
    dead.swap(gGraveyard);
  }
  for (CommState* s : dead) {
    gLive.erase(s);
    delete s;
  }
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else.
int finalizing(MPI_Comm, int, void*, void*) {
  std::lock_guard<std::mutex> lock(gMutex);
  InsideSquall inside;
  drainGraveyard();
  for (CommState* s : gLive) {  // still attached to live communicators: keep the shell
    std::lock_guard<std::mutex> stateLock(s->mutex);
    s->step.residuals.clear();
    s->engine.reset();
    s->engineFailed = true;
  }
  gFinalized = true;
  Report::get().finish(policy());
  return MPI_SUCCESS;
}

// Once, under gMutex.
void setUp() {
  if (gKeyval != MPI_KEYVAL_INVALID) return;
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, forgetState, &gKeyval, nullptr);
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, finalizing, &gSelfKeyval, nullptr);
  PMPI_Comm_set_attr(MPI_COMM_SELF, gSelfKeyval, nullptr);
  int rank = -1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Report::get().setRank(rank);
}

CommState* stateOf(MPI_Comm comm) {
  void* value = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, gKeyval, &value, &found);
  if (found) return static_cast<CommState*>(value);
  auto* s = new CommState(policy());
  PMPI_Comm_set_attr(comm, gKeyval, s);
  gLive.insert(s);
  return s;
}

int typeBytes(MPI_Datatype type) {
  int size = 0;
  if (type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &size) != MPI_SUCCESS) return 0;
  return size;
}

// The decision for a call of a compressible type and op, given its
// communicator's state. Every such call is placed in the step, small ones too:
// they are part of the step's sequence even though they run at full precision.
Verdict decide(CommState& s, size_t count, bool small, int nranks, int64_t* offset) {
  const StepTracker::Placement at = s.step.place(count);
  if (small) return Verdict::kSmall;
  if (s.step.eligible++ < policy().warmupCalls) return Verdict::kWarmup;
  if (!at.known) return Verdict::kLearning;
  *offset = at.offset;
  if (!s.step.residuals.fits(residualBytes(count, nranks))) return Verdict::kResidualCap;
  if (s.engineFailed) return Verdict::kEngine;
  return Verdict::kCompress;
}

// True when every rank of `comm` says `mine`: every rank calls this at the
// same call, since every rank reaches the same decision before it.
bool everyRank(MPI_Comm comm, bool mine) {
  int in = mine ? 1 : 0, out = 0;
  return PMPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && out == 1;
}

// Starts `state`'s engine on every rank of `comm` or on none: a rank that
// compressed while another passed the call through would run a different
// collective. The ranks agree twice: before the engine's collective set-up,
// on what each can check alone (a rank that failed there would skip a
// collective the others enter), and after it, on whether it worked.
bool startEngine(MPI_Comm comm, CommState* state) {
  core::CommConfig config;
  bool ready = core::CommConfig::fromEnvironment(&config) == Status::kOk;
  if (ready) {
    // Squall's MPI transport runs only where MPI allows this thread to.
    int level = MPI_THREAD_SINGLE, isMain = 0;
    PMPI_Query_thread(&level);
    PMPI_Is_thread_main(&isMain);
    ready = level >= MPI_THREAD_SERIALIZED || isMain;
    if (!ready)
      SQUALL_FAIL(Status::kUnsupported, Subsys::kApi,
                  "MPI was initialised below MPI_THREAD_SERIALIZED and this call comes from "
                  "another thread than the one that initialised it; initialise MPI with "
                  "MPI_THREAD_SERIALIZED or make the calls from the main thread");
  }
  const bool allReady = everyRank(comm, ready);
  const bool made = allReady && core::Comm::fromMpi(&comm, config, &state->engine) == Status::kOk;
  if (allReady && everyRank(comm, made)) return true;
  state->step.residuals.clear();
  state->engine.reset();
  // The cause was logged where it was found, on the rank that found it.
  SQUALL_WARN(Subsys::kApi,
              "the interposer passes this communicator's allreduces through at full "
              "precision on every rank: %s could not start Squall's engine",
              (allReady ? made : ready) ? "another rank" : "this rank");
  return false;
}

}  // namespace
}  // namespace squall::preload

extern "C" [[gnu::visibility("default")]] int MPI_Allreduce(const void* sendbuf, void* recvbuf,
                                                            int count, MPI_Datatype datatype,
                                                            MPI_Op op, MPI_Comm comm) {
  using namespace squall;
  using namespace squall::preload;
  if (insideSquall()) {  // Squall's own call (none today: its MPI transport has no allreduce)
    Report::get().passed(Verdict::kReentry, 0);
    return real_mpi::allReduce(sendbuf, recvbuf, count, datatype, op, comm);
  }
  CallFacts facts;
  facts.count = count > 0 ? static_cast<size_t>(count) : 0;
  facts.dtypeKnown = datatype == MPI_FLOAT;
  facts.opKnown = op == MPI_SUM;
  Verdict verdict = policy().judge(facts);
  int nranks = 1, inter = 0;
  if (comm != MPI_COMM_NULL) {
    PMPI_Comm_test_inter(comm, &inter);
    if (inter)
      PMPI_Comm_remote_size(comm, &nranks);
    else
      PMPI_Comm_size(comm, &nranks);
  }
  const bool placed = verdict == Verdict::kCompress || (verdict == Verdict::kSmall && count > 0);
  if (placed && (comm == MPI_COMM_NULL || inter || nranks < 2)) verdict = Verdict::kCommunicator;
  const uint64_t fullBytes =
      nranks > 1 && count > 0
          ? static_cast<uint64_t>(2.0 * (nranks - 1) / nranks * count * typeBytes(datatype))
          : 0;

  std::unique_lock<std::mutex> lock;  // the state's
  CommState* state = nullptr;
  int64_t offset = 0;
  if (placed && verdict != Verdict::kCommunicator) {
    {
      std::lock_guard<std::mutex> registry(gMutex);
      if (!gFinalized) {
        setUp();
        drainGraveyard();
        state = stateOf(comm);
      }
    }
    // `state` lives until `comm` is freed, which MPI forbids during a call on it.
    if (state == nullptr) {
      if (verdict == Verdict::kCompress) verdict = Verdict::kEngine;
    } else {
      lock = std::unique_lock<std::mutex>(state->mutex);
      verdict = decide(*state, facts.count, verdict == Verdict::kSmall, nranks, &offset);
    }
  }
  if (verdict == Verdict::kCompress && !state->engine) {
    InsideSquall inside;
    if (!startEngine(comm, state)) {
      state->engineFailed = true;
      verdict = Verdict::kEngine;
    }
  }
  if (verdict != Verdict::kCompress) {
    if (lock.owns_lock()) lock.unlock();
    Report::get().passed(verdict, fullBytes);
    return real_mpi::allReduce(sendbuf, recvbuf, count, datatype, op, comm);
  }

  // Small tensors inside a fused buffer (biases, norms) go at full precision.
  const CutCall cut{DataType::kF32, offset, facts.count, nranks, ReduceOp::kSum, nullptr};
  const std::vector<TensorEdges::Run> runs = cutRuns(state->step, policy(), cut);
  if (runs.size() == 1 && runs[0].full) {
    lock.unlock();
    Report::get().passed(Verdict::kSmall, fullBytes);
    return real_mpi::allReduce(sendbuf, recvbuf, count, datatype, op, comm);
  }
  InsideSquall inside;
  struct {
    const float* in;
    float* out;
    bool inPlace;
    MPI_Comm comm;
    core::Comm& engine;
    int full(size_t skip, size_t n) const {
      return real_mpi::allReduce(inPlace ? MPI_IN_PLACE : in + skip, out + skip,
                                 static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm);
    }
    int compressed(size_t skip, core::Compressor& c) const {
      return engine.compressedAllReduce(in + skip, out + skip, DataType::kF32, ReduceOp::kSum, c) ==
                     Status::kOk
                 ? MPI_SUCCESS
                 : MPI_ERR_OTHER;
    }
    static int failed(Status) { return MPI_ERR_INTERN; }  // described where it failed
  } front{static_cast<const float*>(sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf),
          static_cast<float*>(recvbuf), sendbuf == MPI_IN_PLACE, comm, *state->engine};
  uint64_t sent = 0;
  if (const int rc = runCut(state->step, *state->engine, policy(), cut, runs, front, &sent);
      rc != MPI_SUCCESS)
    return rc;
  Report::get().compressed(policy().codec.codec, sent, fullBytes);
  return MPI_SUCCESS;
}
