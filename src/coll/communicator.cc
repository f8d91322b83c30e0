#include "src/coll/communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "src/coll/algorithms.h"
#include "src/coll/reduce.h"
#include "src/common/params.h"

namespace squall::coll {
namespace {

using transport::Descriptor;

Descriptor descriptorOf(CollKind kind, DataType dtype, ReduceOp op, size_t count) {
  Descriptor d;
  d.kind = kind;
  d.dtype = dtype;
  d.op = op;
  d.count = count;
  return d;
}

// A broadcast's root is part of what every rank must agree on; it travels in
// the descriptor's block field, which broadcasts have no other use for.
Descriptor broadcastDescriptor(DataType dtype, size_t count, int root) {
  Descriptor d = descriptorOf(CollKind::kBroadcast, dtype, ReduceOp::kSum, count);
  d.block = static_cast<uint32_t>(root);
  return d;
}

// The largest buffer a collective takes: its byte size must fit a ptrdiff_t,
// so that no pointer arithmetic over it can overflow.
constexpr size_t kMaxBufferBytes = static_cast<size_t>(PTRDIFF_MAX);

// Checks the buffers of a collective whose input holds `count * inFactor`
// and whose output holds `count * outFactor` elements of `dtype`: a known
// type, no NULL buffer unless count is 0, sizes that fit in memory, and
// buffers that are either the same (in place, where allowed) or disjoint.
Status checkBuffers(const void* in, const void* out, size_t count, DataType dtype, const char* what,
                    size_t inFactor = 1, size_t outFactor = 1) {
  SQUALL_REQUIRE(isValidDataType(dtype), Status::kInvalidArgument, Subsys::kColl,
                 "%s: data type %u is not one of float32, float16, bfloat16, float64, int32, "
                 "int64",
                 what, static_cast<unsigned>(dtype));
  const size_t factor = std::max(inFactor, outFactor);
  const size_t limit = kMaxBufferBytes / dataTypeSize(dtype) / factor;
  SQUALL_REQUIRE(count <= limit, Status::kInvalidArgument, Subsys::kColl,
                 "%s: count %zu of %s is too large to fit in memory (at most %zu%s); pass the "
                 "number of elements, not bytes or a negative value",
                 what, count, dataTypeName(dtype), limit,
                 factor > 1 ? ", since a buffer holds nranks x count elements" : "");
  SQUALL_REQUIRE((in != nullptr && out != nullptr) || count == 0, Status::kInvalidArgument,
                 Subsys::kColl, "%s: the %s buffer is NULL but count is %zu", what,
                 in == nullptr ? "input" : "output", count);
  if (in != out && count != 0) {
    const size_t esize = dataTypeSize(dtype);
    const auto a = reinterpret_cast<uintptr_t>(in);
    const auto b = reinterpret_cast<uintptr_t>(out);
    const size_t inBytes = count * inFactor * esize;
    const size_t outBytes = count * outFactor * esize;
    const bool overlap = a < b ? b - a < inBytes : a - b < outBytes;
    SQUALL_REQUIRE(!overlap, Status::kInvalidArgument, Subsys::kColl,
                   "%s: the input and output buffers overlap without being the same buffer; "
                   "pass the same pointer for in place, or disjoint buffers",
                   what);
  }
  return Status::kOk;
}

// The types and ops the compressed collectives take.
Status checkCompressedTypes(DataType dtype, ReduceOp op, const char* what) {
  SQUALL_REQUIRE(dtype == DataType::kF32 || dtype == DataType::kF16 || dtype == DataType::kBf16,
                 Status::kInvalidArgument, Subsys::kColl,
                 "%s takes float32, float16 or bfloat16, not %s", what,
                 isValidDataType(dtype) ? dataTypeName(dtype) : "an unknown type");
  SQUALL_REQUIRE(op == ReduceOp::kSum || op == ReduceOp::kAvg, Status::kInvalidArgument,
                 Subsys::kColl, "%s supports sum and avg, not %s", what,
                 isValidReduceOp(op) ? reduceOpName(op) : "an unknown op");
  return Status::kOk;
}

Descriptor compressedDescriptor(CollKind kind, DataType dtype, ReduceOp op, size_t count,
                                const codec::Spec& spec) {
  Descriptor d = descriptorOf(kind, dtype, op, count);
  d.codec = static_cast<uint8_t>(spec.codec);
  d.block = codec::usesBlocks(spec.codec) ? spec.block : 0;
  return d;
}

Status checkAllToAll(const void* in, const void* out, size_t count, DataType dtype, int size) {
  const auto n = static_cast<size_t>(size);
  SQUALL_TRY(checkBuffers(in, out, count, dtype, "alltoall", n, n));
  SQUALL_REQUIRE(in != out || count == 0, Status::kInvalidUsage, Subsys::kColl,
                 "alltoall cannot run in place; pass a separate output buffer");
  return Status::kOk;
}

Status checkAllGather(const void* in, const void* out, size_t count, DataType dtype, int size) {
  const auto n = static_cast<size_t>(size);
  SQUALL_TRY(checkBuffers(in, out, count, dtype, "allgather", 1, n));
  SQUALL_REQUIRE(in != out || count == 0 || n == 1, Status::kInvalidUsage, Subsys::kColl,
                 "allgather cannot run in place: its output holds nranks x count elements; pass "
                 "a separate output buffer");
  return Status::kOk;
}

Status checkBroadcast(const void* buffer, size_t count, DataType dtype, int root, int size) {
  SQUALL_TRY(checkBuffers(buffer, buffer, count, dtype, "broadcast"));
  SQUALL_REQUIRE(root >= 0 && root < size, Status::kInvalidArgument, Subsys::kColl,
                 "broadcast: root %d is not a rank of this group of %d", root, size);
  return Status::kOk;
}

}  // namespace

Options Options::fromEnvironment() {
  Options o;
  const int64_t seconds = paramInt(Param::kTimeoutS);
  if (seconds > 0) {
    o.timeout = std::chrono::milliseconds(seconds * 1000);
  } else {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_TIMEOUT_S must be a positive number of seconds, not "
                "%lld; using 300",
                static_cast<long long>(seconds));
  }
  const std::string algo = paramString(Param::kAllReduceAlgo);
  if (algo == "ring")
    o.allReduceAlgo = AllReduceAlgo::kRing;
  else if (algo == "direct")
    o.allReduceAlgo = AllReduceAlgo::kDirect;
  else if (algo == "rhd")
    o.allReduceAlgo = AllReduceAlgo::kHalvingDoubling;
  else if (algo != "auto")
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_ALLREDUCE_ALGO is '%s'; expected auto, ring, rhd or direct; "
                "using auto",
                algo.c_str());
  const int64_t small = paramInt(Param::kAllReduceSmallBytes);
  if (small >= 0) o.allReduceSmallBytes = static_cast<size_t>(small);
  const int64_t ring = paramInt(Param::kAllReduceRingBytes);
  if (ring >= 0) o.allReduceRingBytes = static_cast<size_t>(ring);
  const std::string compressed = paramString(Param::kCompressedAlgo);
  if (compressed == "twophase")
    o.compressedAlgo = CompressedAlgo::kTwoPhase;
  else if (compressed == "allgather")
    o.compressedAlgo = CompressedAlgo::kAllGather;
  else if (compressed != "auto")
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_COMPRESSED_ALGO is '%s'; expected auto, twophase or "
                "allgather; using auto",
                compressed.c_str());
  const int64_t segment = paramInt(Param::kSegmentBytes);
  if (segment >= 0) o.segmentBytes = static_cast<size_t>(segment);
  const int64_t ringSegments = paramInt(Param::kRingMaxSegments);
  if (ringSegments >= 0) o.ringMaxSegments = static_cast<size_t>(ringSegments);
  const int64_t mbps = paramInt(Param::kNetMbps);
  if (mbps > 0)
    o.netMbps = static_cast<double>(mbps);
  else
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_NET_MBPS must be a bandwidth > 0 in Mbit/s, not %lld; "
                "using 10000",
                static_cast<long long>(mbps));
  const int64_t latency = paramInt(Param::kNetLatencyUs);
  if (latency >= 0)
    o.netLatencyUs = static_cast<double>(latency);
  else
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_NET_LATENCY_US must be >= 0 microseconds, not %lld; "
                "using 50",
                static_cast<long long>(latency));
  return o;
}

// ---- Operation -------------------------------------------------------------

bool Operation::test() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

Status Operation::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return finished_; });
  return status_;
}

std::string Operation::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

void Operation::finish(Status status, std::string message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    status_ = status;
    message_ = std::move(message);
  }
  done_.notify_all();
}

// ---- Communicator: execution -------------------------------------------------

Communicator::Communicator(transport::Transport* transport, Options options)
    : transport_(transport), options_(options) {}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Status Communicator::execute(uint64_t sequence, const Descriptor& descriptor,
                             const Options& options, const Body& body) {
  OpContext ctx{transport_, sequence, descriptor, transport::Clock::now() + options.timeout,
                &options};
  ctx.scratch = &scratch_;
  ctx.bytes = &bytes_;
  ctx.abortLogged = &abortLogged_;
  if (ctx.size() == 1) return body(ctx);
  auto watch = std::make_unique<AbortWatch>();
  SQUALL_TRY(watchForAborts(ctx, watch.get()));
  ctx.abort = watch.get();
  ctx.previousAbort = previousWatch_.get();
  const Status status = body(ctx);
  if (status != Status::kOk && !watch->received) {
    const std::string what = transport::describe(ctx.tag(0));
    std::string reason = "rank " + std::to_string(ctx.rank());
    reason.append(" failed ").append(what).append(": ").append(lastError());
    sendAbortNotices(ctx, reason);
  }
  // The older watch's pending receives are cancelled here. This one's stay
  // posted through the next operation when this one succeeded here; when it
  // failed, the peers' notices about it say nothing new.
  if (status == Status::kOk) {
    previousWatch_ = std::move(watch);
  } else {
    previousWatch_.reset();
  }
  return status;
}

void Communicator::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return running_ == 0; });
}

Status Communicator::refuse(Status check) {
  if (check == Status::kOk || size() == 1) return check;
  // Nobody waits for the refusal: the next blocking call drains the queue.
  // enqueue cannot fail with an output pointer, and leaves lastError() alone.
  OperationPtr refusal;
  (void)enqueue(
      descriptorOf(CollKind::kBarrier, DataType::kF32, ReduceOp::kSum, 0),
      [check, reason = lastError()](const OpContext&) {
        setLastError(reason);  // execute() sends it to the peers
        return check;
      },
      &refusal);
  return check;
}

Status Communicator::runBlocking(const Descriptor& descriptor, const Body& body) {
  drain();
  return execute(sequence_++, descriptor, options_, body);
}

Status Communicator::enqueue(const Descriptor& descriptor, Body body, OperationPtr* operation) {
  SQUALL_REQUIRE(operation != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the operation output pointer is NULL");
  auto op = std::make_shared<Operation>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
    queue_.push_back(Queued{sequence_++, descriptor, options_, std::move(body), op});
    ++running_;
  }
  changed_.notify_all();
  *operation = std::move(op);
  return Status::kOk;
}

void Communicator::workerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    Queued item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    clearLastError();
    const Status status = execute(item.sequence, item.descriptor, item.options, item.body);
    lock.lock();
    std::string error;
    if (status != Status::kOk) {
      // After destroy, the likely cause is the destroy itself (the peers
      // destroyed theirs too), which the waiter must be told.
      if (stopping_) {
        error = "the communicator was destroyed before " +
                transport::describe(transport::Tag{item.sequence, 0, item.descriptor}) +
                " completed (wait for a request before destroying its communicator); it failed "
                "with: ";
      }
      error += lastError();
    }
    item.operation->finish(status, std::move(error));
    --running_;
    changed_.notify_all();
  }
}

// ---- Communicator: collectives -----------------------------------------------

Status Communicator::checkAllReduce(const void* in, void* out, size_t count, DataType dtype,
                                    ReduceOp op) {
  SQUALL_TRY(checkBuffers(in, out, count, dtype, "allreduce"));
  SQUALL_REQUIRE(isValidReduceOp(op), Status::kInvalidArgument, Subsys::kColl,
                 "allreduce: reduction op %u is not one of sum, avg, min, max",
                 static_cast<unsigned>(op));
  return Status::kOk;
}

Communicator::Body Communicator::allReduceBody(const void* in, void* out, size_t count,
                                               DataType dtype, ReduceOp op) {
  return [=](const OpContext& ctx) {
    AllReduceAlgo algo = ctx.options->allReduceAlgo;
    if (algo == AllReduceAlgo::kAuto) {
      const size_t bytes = count * dataTypeSize(dtype);
      algo = bytes <= ctx.options->allReduceSmallBytes  ? AllReduceAlgo::kDirect
             : bytes <= ctx.options->allReduceRingBytes ? AllReduceAlgo::kHalvingDoubling
                                                        : AllReduceAlgo::kRing;
    }
    switch (algo) {
      case AllReduceAlgo::kDirect: return directAllReduce(ctx, in, out, count, dtype, op);
      case AllReduceAlgo::kHalvingDoubling:
        return halvingDoublingAllReduce(ctx, in, out, count, dtype, op);
      default: return ringAllReduce(ctx, in, out, count, dtype, op);
    }
  };
}

Status Communicator::allReduce(const void* in, void* out, size_t count, DataType dtype,
                               ReduceOp op) {
  SQUALL_TRY(refuse(checkAllReduce(in, out, count, dtype, op)));
  return runBlocking(descriptorOf(CollKind::kAllReduce, dtype, op, count),
                     allReduceBody(in, out, count, dtype, op));
}

Status Communicator::startAllReduce(const void* in, void* out, size_t count, DataType dtype,
                                    ReduceOp op, OperationPtr* operation) {
  SQUALL_TRY(refuse(checkAllReduce(in, out, count, dtype, op)));
  return enqueue(descriptorOf(CollKind::kAllReduce, dtype, op, count),
                 allReduceBody(in, out, count, dtype, op), operation);
}

Status Communicator::allGather(const void* in, void* out, size_t count, DataType dtype) {
  SQUALL_TRY(refuse(checkAllGather(in, out, count, dtype, size())));
  return runBlocking(
      descriptorOf(CollKind::kAllGather, dtype, ReduceOp::kSum, count),
      [=](const OpContext& ctx) { return ringAllGather(ctx, in, out, count, dtype); });
}

Status Communicator::startAllGather(const void* in, void* out, size_t count, DataType dtype,
                                    OperationPtr* operation) {
  SQUALL_TRY(refuse(checkAllGather(in, out, count, dtype, size())));
  return enqueue(
      descriptorOf(CollKind::kAllGather, dtype, ReduceOp::kSum, count),
      [=](const OpContext& ctx) { return ringAllGather(ctx, in, out, count, dtype); }, operation);
}

Status Communicator::allToAll(const void* in, void* out, size_t count, DataType dtype) {
  SQUALL_TRY(refuse(checkAllToAll(in, out, count, dtype, size())));
  return runBlocking(
      descriptorOf(CollKind::kAllToAll, dtype, ReduceOp::kSum, count),
      [=](const OpContext& ctx) { return pairwiseAllToAll(ctx, in, out, count, dtype); });
}

Status Communicator::startAllToAll(const void* in, void* out, size_t count, DataType dtype,
                                   OperationPtr* operation) {
  SQUALL_TRY(refuse(checkAllToAll(in, out, count, dtype, size())));
  return enqueue(
      descriptorOf(CollKind::kAllToAll, dtype, ReduceOp::kSum, count),
      [=](const OpContext& ctx) { return pairwiseAllToAll(ctx, in, out, count, dtype); },
      operation);
}

Status Communicator::broadcast(void* buffer, size_t count, DataType dtype, int root) {
  SQUALL_TRY(refuse(checkBroadcast(buffer, count, dtype, root, size())));
  return runBlocking(broadcastDescriptor(dtype, count, root), [=](const OpContext& ctx) {
    return binomialBroadcast(ctx, buffer, count, dtype, root);
  });
}

Status Communicator::startBroadcast(void* buffer, size_t count, DataType dtype, int root,
                                    OperationPtr* operation) {
  SQUALL_TRY(refuse(checkBroadcast(buffer, count, dtype, root, size())));
  return enqueue(
      broadcastDescriptor(dtype, count, root),
      [=](const OpContext& ctx) { return binomialBroadcast(ctx, buffer, count, dtype, root); },
      operation);
}

Status Communicator::barrier() {
  return runBlocking(descriptorOf(CollKind::kBarrier, DataType::kF32, ReduceOp::kSum, 0),
                     [](const OpContext& ctx) { return disseminationBarrier(ctx); });
}

Status Communicator::startBarrier(OperationPtr* operation) {
  return enqueue(
      descriptorOf(CollKind::kBarrier, DataType::kF32, ReduceOp::kSum, 0),
      [](const OpContext& ctx) { return disseminationBarrier(ctx); }, operation);
}

Status Communicator::checkCompressed(const void* in, void* out, DataType dtype, ReduceOp op,
                                     const CompressedState* state, Descriptor* descriptor) {
  SQUALL_REQUIRE(state != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "compressed allreduce: the state is NULL; create one per buffer with "
                 "CompressedState::create and keep it across calls");
  SQUALL_REQUIRE(state->nranks() == size(), Status::kInvalidUsage, Subsys::kColl,
                 "compressed allreduce: the state was created for %d ranks but the "
                 "communicator has %d",
                 state->nranks(), size());
  SQUALL_REQUIRE(!state->reduceScatter(), Status::kInvalidUsage, Subsys::kColl,
                 "compressed allreduce: the state was made for the compressed reduce-scatter "
                 "(%d x %zu elements); make one for the allreduce with "
                 "Communicator::createCompressedState",
                 state->nranks(), state->chunk());
  SQUALL_TRY(checkCompressedTypes(dtype, op, "compressed allreduce"));
  if (state->hierarchical()) {
    const Hierarchy* h = hierarchy_.get();
    SQUALL_REQUIRE(h != nullptr && h->layout.hosts == state->hosts() &&
                       h->layout.local == state->localRanks() &&
                       h->layout.localIndex == state->localIndex(),
                   Status::kInvalidUsage, Subsys::kColl,
                   "compressed allreduce: the state was created for the hierarchical layout of "
                   "%d hosts x %d ranks (local index %d), which this communicator does not have; "
                   "create the state with Communicator::createCompressedState",
                   state->hosts(), state->localRanks(), state->localIndex());
  }
  SQUALL_TRY(checkBuffers(in, out, state->count(), dtype, "compressed allreduce"));
  *descriptor = compressedDescriptor(CollKind::kCompressedAllReduce, dtype, op, state->count(),
                                     state->spec());
  return Status::kOk;
}

Status Communicator::checkReduceScatter(const void* in, const void* out, size_t recvcount,
                                        DataType dtype, ReduceOp op, const CompressedState* state,
                                        Descriptor* descriptor) {
  SQUALL_REQUIRE(state != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "compressed reduce-scatter: the state is NULL; create one per buffer with "
                 "CompressedState::createReduceScatter and keep it across calls");
  SQUALL_REQUIRE(state->reduceScatter(), Status::kInvalidUsage, Subsys::kColl,
                 "compressed reduce-scatter: the state was made for the compressed allreduce "
                 "of %zu elements; make one for the reduce-scatter with "
                 "CompressedState::createReduceScatter",
                 state->count());
  SQUALL_REQUIRE(state->nranks() == size(), Status::kInvalidUsage, Subsys::kColl,
                 "compressed reduce-scatter: the state was created for %d ranks but the "
                 "communicator has %d",
                 state->nranks(), size());
  SQUALL_REQUIRE(recvcount == state->chunk(), Status::kInvalidArgument, Subsys::kColl,
                 "compressed reduce-scatter: recvcount is %zu but the state was made for %zu "
                 "elements per rank (an input of %d x %zu); make one state per buffer",
                 recvcount, state->chunk(), state->nranks(), state->chunk());
  SQUALL_TRY(checkCompressedTypes(dtype, op, "compressed reduce-scatter"));
  // In place: the output is this rank's piece of the input.
  const auto from = reinterpret_cast<uintptr_t>(in);
  const auto to = reinterpret_cast<uintptr_t>(out);
  const bool inPlace = in != nullptr && to >= from &&
                       to - from == static_cast<size_t>(rank()) * recvcount * dataTypeSize(dtype);
  SQUALL_TRY(checkBuffers(in, inPlace ? in : out, recvcount, dtype, "compressed reduce-scatter",
                          static_cast<size_t>(size()), 1));
  *descriptor =
      compressedDescriptor(CollKind::kCompressedReduceScatter, dtype, op, recvcount, state->spec());
  return Status::kOk;
}

Communicator::Body Communicator::compressedBody(const void* in, void* out, DataType dtype,
                                                ReduceOp op, CompressedState* state) {
  const Hierarchy* hierarchy = hierarchy_.get();
  return [=](const OpContext& ctx) {
    const size_t count = state->count();
    if (ctx.size() == 1 || count == 0) {
      // Nothing to exchange: the input is the result and the residuals stay.
      if (in != out && count != 0) std::memcpy(out, in, count * dataTypeSize(dtype));
      state->recordStats(CompressedStats{});
      return Status::kOk;
    }
    if (state->hierarchical())
      return hierarchicalCompressedAllReduce(ctx, *hierarchy, in, out, dtype, op, state);
    const CompressedAlgo algo = resolveCompressedAlgo(
        ctx.size(), *state, ctx.options->compressedAlgo, ctx.options->latencyBytes());
    return algo == CompressedAlgo::kAllGather
               ? allGatherCompressedAllReduce(ctx, in, out, dtype, op, state)
               : twoPhaseCompressedAllReduce(ctx, in, out, dtype, op, state);
  };
}

Communicator::Body Communicator::reduceScatterBody(const void* in, void* out, DataType dtype,
                                                   ReduceOp op, CompressedState* state) {
  return [=](const OpContext& ctx) {
    const size_t recvcount = state->chunk();
    if (ctx.size() == 1 || recvcount == 0) {
      // Nothing to exchange: the input is the result and the residual stays.
      if (in != out && recvcount != 0) std::memcpy(out, in, recvcount * dataTypeSize(dtype));
      state->recordStats(CompressedStats{});
      return Status::kOk;
    }
    return directCompressedReduceScatter(ctx, in, out, dtype, op, state);
  };
}

Status Communicator::createCompressedState(size_t count, const codec::Spec& spec, size_t phase,
                                           std::unique_ptr<CompressedState>* out, Feedback feedback,
                                           codec::ResidualStore store) const {
  if (hierarchy_ == nullptr)
    return CompressedState::create(size(), count, spec, out, phase, feedback, store);
  const HostLayout& l = hierarchy_->layout;
  return CompressedState::createHierarchical(l.hosts, l.local, l.localIndex, count, spec, out,
                                             feedback, store);
}

Status Communicator::compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                         CompressedState* state) {
  Descriptor descriptor;
  SQUALL_TRY(refuse(checkCompressed(in, out, dtype, op, state, &descriptor)));
  return runBlocking(descriptor, compressedBody(in, out, dtype, op, state));
}

Status Communicator::startCompressedAllReduce(const void* in, void* out, DataType dtype,
                                              ReduceOp op, CompressedState* state,
                                              OperationPtr* operation) {
  Descriptor descriptor;
  SQUALL_TRY(refuse(checkCompressed(in, out, dtype, op, state, &descriptor)));
  return enqueue(descriptor, compressedBody(in, out, dtype, op, state), operation);
}

Status Communicator::compressedReduceScatter(const void* in, void* out, size_t recvcount,
                                             DataType dtype, ReduceOp op, CompressedState* state) {
  Descriptor descriptor;
  SQUALL_TRY(refuse(checkReduceScatter(in, out, recvcount, dtype, op, state, &descriptor)));
  return runBlocking(descriptor, reduceScatterBody(in, out, dtype, op, state));
}

Status Communicator::startCompressedReduceScatter(const void* in, void* out, size_t recvcount,
                                                  DataType dtype, ReduceOp op,
                                                  CompressedState* state, OperationPtr* operation) {
  Descriptor descriptor;
  SQUALL_TRY(refuse(checkReduceScatter(in, out, recvcount, dtype, op, state, &descriptor)));
  return enqueue(descriptor, reduceScatterBody(in, out, dtype, op, state), operation);
}

}  // namespace squall::coll
