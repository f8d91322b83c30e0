#include "src/codec/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "src/codec/numeric.h"
#include "src/common/log.h"
#include "src/common/params.h"

namespace squall::codec {
namespace {

constexpr int kMaxThreads = 64;
constexpr size_t kElementUnit = 64;  // piece granularity of the element-wise codecs

std::atomic<int> gLocalRanks{0};  // 0: no communicator has counted yet
std::atomic<int> gOverride{0};

// A piece of work the pool runs: piece i of `pieces`, i >= 1 (the caller
// runs piece 0).
struct Work {
  void (*run)(const void* context, int piece) = nullptr;
  const void* context = nullptr;
  int pieces = 0;
};

// Workers sleep on a condition variable between calls: on a machine whose
// cores are shared with other ranks, spinning would take time from them.
// The pool is never destroyed (its workers may still be waiting when static
// destructors run); after fork() the child, which has none of the parent's
// threads, starts a fresh one and keeps the old one reachable.
struct Pool {
  std::mutex submit;  // one call at a time; others run on their caller
  std::mutex mutex;
  std::condition_variable wake, finished;
  uint64_t generation = 0;
  int remaining = 0;  // pieces of the current generation not yet finished
  Work work;
  int workers = 0;
  Pool* previous = nullptr;  // the parent's pool after a fork, kept reachable

  void workerLoop(int index) {
    uint64_t seen = 0;
    for (;;) {
      Work w;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return generation != seen; });
        seen = generation;
        w = work;
      }
      if (index >= w.pieces) continue;
      w.run(w.context, index);
      std::lock_guard<std::mutex> lock(mutex);
      if (--remaining == 0) finished.notify_one();
    }
  }

  // Starts workers up to `count` (index 1..count); false when a thread could
  // not be started, in which case the caller runs the call alone.
  bool ensureWorkers(int count) {
    while (workers < count) {
      try {
        const int index = workers + 1;
        std::thread t([this, index] { workerLoop(index); });
        pthread_setname_np(t.native_handle(), "squall-codec");
        t.detach();
      } catch (const std::system_error& e) {
        SQUALL_WARN(Subsys::kCodec,
                    "could not start a codec thread (%s); the codec runs on %d thread(s)", e.what(),
                    workers + 1);
        return false;
      }
      ++workers;
    }
    return true;
  }

  void run(const Work& w) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      work = w;
      remaining = w.pieces - 1;
      ++generation;
    }
    wake.notify_all();
    w.run(w.context, 0);
    std::unique_lock<std::mutex> lock(mutex);
    finished.wait(lock, [&] { return remaining == 0; });
  }
};

Pool* gPool = nullptr;
std::once_flag gPoolOnce;

void afterForkInChild() {
  auto* fresh = new Pool;
  fresh->previous = gPool;
  gPool = fresh;
}

Pool& pool() {
  std::call_once(gPoolOnce, [] {
    gPool = new Pool;
    pthread_atfork(nullptr, nullptr, afterForkInChild);
  });
  return *gPool;
}

int paramThreads() {
  static const int threads = [] {
    const int64_t v = paramInt(Param::kCodecThreads);
    if (v < 0 || v > kMaxThreads) {
      SQUALL_WARN(Subsys::kEnv, "SQUALL_CODEC_THREADS=%lld is outside 0..%d; using the default",
                  static_cast<long long>(v), kMaxThreads);
      return 0;
    }
    return static_cast<int>(v);
  }();
  return threads;
}

// Runs `pieces` pieces of `run` and returns when all are done.
void runPieces(int pieces, void (*run)(const void*, int), const void* context) {
  if (pieces > 1) {
    Pool& p = pool();
    std::unique_lock<std::mutex> lock(p.submit, std::try_to_lock);
    if (lock.owns_lock() && p.ensureWorkers(pieces - 1)) {
      p.run(Work{run, context, pieces});
      return;
    }
  }
  for (int i = 0; i < pieces; ++i) run(context, i);
}

struct Range {
  size_t begin = 0, end = 0, firstBlock = 0, blocks = 0;
};

size_t unitOf(const Spec& spec) { return usesBlocks(spec.codec) ? spec.block : kElementUnit; }

// Piece i of `pieces` over `count` elements, in whole units (blocks).
Range pieceRange(const Spec& spec, size_t count, int pieces, int i) {
  const size_t unit = unitOf(spec);
  const size_t units = (count + unit - 1) / unit;
  const auto n = static_cast<size_t>(pieces);
  const auto k = static_cast<size_t>(i);
  // The first units % n pieces take one unit more, so sizes differ by at
  // most one unit.
  const size_t base = units / n, extra = units % n;
  const size_t firstUnit = k * base + std::min(k, extra);
  const size_t lastUnit = firstUnit + base + (k < extra ? 1 : 0);
  Range r;
  r.begin = std::min(firstUnit * unit, count);
  r.end = std::min(lastUnit * unit, count);
  if (usesBlocks(spec.codec)) {
    r.firstBlock = firstUnit;
    r.blocks = lastUnit - firstUnit;
  }
  return r;
}

// Where the data of element `begin` lies, from the start of the data section.
size_t dataByteOffset(CodecId codec, size_t begin) {
  switch (codec) {
    case CodecId::kOnebit: return begin / 8;  // begin is a multiple of 64
    case CodecId::kInt8: return begin;
    case CodecId::kInt4: return begin / 2;  // begin is a multiple of 64 here too
    case CodecId::kInt2: return begin / 4;
    case CodecId::kNone: return begin * 4;
    case CodecId::kFp16:
    case CodecId::kBf16: return begin * 2;
  }
  return 0;
}

// The payload pointer and layout a kernel needs to see elements
// [begin, end) as a call of its own: scales start at the range's first
// block, and dataOffset is rebased so that payload + dataOffset is the
// range's first data byte.
template <typename Payload>
void rebase(const Spec& spec, const Layout& whole, const Range& r, Payload* payload,
            Layout* layout) {
  *layout = whole;
  if (usesBlocks(spec.codec)) {
    layout->blocks = r.blocks;
    layout->dataOffset = whole.dataOffset + dataByteOffset(spec.codec, r.begin) - r.firstBlock * 4;
    *payload += r.firstBlock * 4;
  } else {
    *payload += dataByteOffset(spec.codec, r.begin);
  }
}

// ---- tiles: a bf16 residual's encodes, and sums of several encodings --------

// A tile holds whole units, at least kTileElements elements when the unit is
// smaller: 16 KiB of fp32, which the L1 cache holds next to the encodings'
// bits. A unit (codec block) larger than that is a tile of its own.
constexpr size_t kTileElements = 4096;

size_t tileElements(const Spec& spec) { return std::max(unitOf(spec), kTileElements); }

// The tile of `length` elements at `begin` (a multiple of the unit), as a Range.
Range tileRange(const Spec& spec, size_t begin, size_t length) {
  Range r;
  r.begin = begin;
  r.end = begin + length;
  if (usesBlocks(spec.codec)) {
    r.firstBlock = begin / spec.block;
    r.blocks = (length + spec.block - 1) / spec.block;
  }
  return r;
}

// A thread's buffers for the tiles of one piece: the tile's sum (a sum's
// encode), and a bf16 residual's owed values widened and the new ones
// before rounding. On the stack for tiles of at most kTileElements.
class Tiles {
 public:
  explicit Tiles(size_t length) : length_(length) {
    if (length > kTileElements) heap_.resize(3 * length);
  }
  float* sum() { return at(0); }
  float* owed() { return at(1); }
  float* left() { return at(2); }

 private:
  float* at(int k) {
    return heap_.empty() ? onStack_[k] : heap_.data() + static_cast<size_t>(k) * length_;
  }
  alignas(64) float onStack_[3][kTileElements];
  std::vector<float> heap_;
  size_t length_;
};

// Runs visit(range, tiles) for every tile of piece i of `pieces` over
// `count` elements coded with `spec`, with tile buffers of this thread's own.
template <typename Visit>
void eachTile(const Spec& spec, size_t count, int pieces, int i, Visit&& visit) {
  const Range r = pieceRange(spec, count, pieces, i);
  if (r.end <= r.begin) return;
  const size_t length = tileElements(spec);
  Tiles tiles(length);
  for (size_t at = r.begin; at < r.end; at += length) {
    visit(tileRange(spec, at, std::min(length, r.end - at)), tiles);
  }
}

// Encodes the elements `t` of `whole` from `input` (t's own elements, of
// `dtype`): the residual at t.begin of whole's fp32 halves, or, with `bf16`,
// the tile's owed values widened into `owed` and the new ones left in
// `left`, then rounded into bf16->out. Returns whether every block was finite.
bool encodeTile(EncodeFn fn, const EncodeJob& whole, const Bf16Residual* bf16, const Range& t,
                const void* input, DType dtype, float* owed, float* left) {
  EncodeJob job = whole;
  job.input = input;
  job.dtype = dtype;
  job.count = t.end - t.begin;
  if (bf16 != nullptr) {
    widenBf16(bf16->in + t.begin, owed, job.count);
    job.residualIn = owed;
    job.residualOut = left;
    job.stream = false;
  } else if (job.residualIn != nullptr) {
    job.residualIn += t.begin;
    job.residualOut += t.begin;
  }
  rebase(whole.spec, whole.layout, t, &job.payload, &job.layout);
  const bool finite = fn(job);
  if (bf16 != nullptr) narrowToBf16(left, bf16->out + t.begin, job.count);
  return finite;
}

struct EncodeContext {
  EncodeFn fn;
  const EncodeJob* job;
  int pieces;
  std::atomic<bool>* finite;
  const Bf16Residual* bf16;
};

void encodePiece(const void* context, int i) {
  const auto& c = *static_cast<const EncodeContext*>(context);
  const EncodeJob& whole = *c.job;
  const Range r = pieceRange(whole.spec, whole.count, c.pieces, i);
  if (r.end <= r.begin) return;
  const auto* input = static_cast<const uint8_t*>(whole.input);
  const size_t size = dtypeSize(whole.dtype);
  bool finite = true;
  if (c.bf16 == nullptr) {  // the kernel takes the whole piece
    finite =
        encodeTile(c.fn, whole, nullptr, r, input + r.begin * size, whole.dtype, nullptr, nullptr);
  } else {
    eachTile(whole.spec, whole.count, c.pieces, i, [&](const Range& t, Tiles& tiles) {
      finite = encodeTile(c.fn, whole, c.bf16, t, input + t.begin * size, whole.dtype, tiles.owed(),
                          tiles.left()) &&
               finite;
    });
  }
  if (!finite) c.finite->store(false, std::memory_order_relaxed);
}

struct DecodeContext {
  DecodeFn fn;
  const DecodeJob* job;
  int pieces;
};

void decodePiece(const void* context, int i) {
  const auto& c = *static_cast<const DecodeContext*>(context);
  const DecodeJob& whole = *c.job;
  const Range r = pieceRange(whole.spec, whole.count, c.pieces, i);
  if (r.end <= r.begin) return;
  DecodeJob job = whole;
  job.count = r.end - r.begin;
  job.output = whole.output + r.begin;
  rebase(whole.spec, whole.layout, r, &job.payload, &job.layout);
  c.fn(job);
}

// tile[0, t.end - t.begin) = the divided sum of the n encodings' elements
// [t.begin, t.end).
void sumTile(const CodecKernels& kernels, const SumJob& sum, const Range& t, float* tile) {
  for (size_t j = 0; j < sum.n; ++j) {
    DecodeJob job{sum.payloads[j], t.end - t.begin, sum.spec, sum.layout, tile};
    rebase(sum.spec, sum.layout, t, &job.payload, &job.layout);
    (j == 0 ? kernels.decode : kernels.accumulate)(job);
  }
  if (sum.divisor > 1) divideAll(tile, t.end - t.begin, sum.divisor);
}

// dst[0, count) = src[0, count); with `stream`, the whole cache lines of dst
// are written with streaming stores (the caller fences).
void storeTile(float* dst, const float* src, size_t count, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    size_t i = 0;
    for (; i < count && (reinterpret_cast<uintptr_t>(dst + i) & 63u) != 0; ++i) dst[i] = src[i];
    for (; i + 16 <= count; i += 16) {
      for (size_t k = 0; k < 16; k += 4) _mm_stream_ps(dst + i + k, _mm_loadu_ps(src + i + k));
    }
    for (; i < count; ++i) dst[i] = src[i];
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, count * sizeof(float));
}

void storeFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

struct DecodeSumContext {
  const CodecKernels* kernels;
  const SumJob* sum;
  float* output;
  bool stream;
  int pieces;
};

void decodeSumPiece(const void* context, int i) {
  const auto& c = *static_cast<const DecodeSumContext*>(context);
  if (c.kernels->sum != nullptr && c.sum->n <= kMaxSumEncodings) {
    // The implementation sums in registers: one job per encoding over this
    // piece, the output stored once.
    const SumJob& sum = *c.sum;
    const Range r = pieceRange(sum.spec, sum.count, c.pieces, i);
    if (r.end <= r.begin) return;
    std::vector<DecodeJob> jobs(sum.n);
    for (size_t j = 0; j < sum.n; ++j) {
      jobs[j] = DecodeJob{sum.payloads[j], r.end - r.begin,    sum.spec,
                          sum.layout,      c.output + r.begin, c.stream};
      rebase(sum.spec, sum.layout, r, &jobs[j].payload, &jobs[j].layout);
    }
    c.kernels->sum(jobs.data(), sum.n, sum.divisor);
    return;
  }
  eachTile(c.sum->spec, c.sum->count, c.pieces, i, [&](const Range& t, Tiles& tiles) {
    sumTile(*c.kernels, *c.sum, t, tiles.sum());
    storeTile(c.output + t.begin, tiles.sum(), t.end - t.begin, c.stream);
  });
  if (c.stream) storeFence();
}

struct EncodeSumContext {
  const CodecKernels* kernels;
  const SumJob* sum;
  EncodeFn encode;
  const EncodeJob* job;
  int pieces;
  std::atomic<bool>* finite;
  const Bf16Residual* bf16;
};

void encodeSumPiece(const void* context, int i) {
  const auto& c = *static_cast<const EncodeSumContext*>(context);
  bool finite = true;
  eachTile(c.sum->spec, c.sum->count, c.pieces, i, [&](const Range& t, Tiles& tiles) {
    sumTile(*c.kernels, *c.sum, t, tiles.sum());
    finite = encodeTile(c.encode, *c.job, c.bf16, t, tiles.sum(), DType::kF32, tiles.owed(),
                        tiles.left()) &&
             finite;
  });
  if (!finite) c.finite->store(false, std::memory_order_relaxed);
}

}  // namespace

// Out of line on purpose: inlined into its callers' loops, gcc kept the
// trip count in memory and the loop ran slower.
void divideAll(float* acc, size_t count, int n) {
  if (divideByProduct(n)) {
    const float inverse = 1.0f / static_cast<float>(n);
    for (size_t i = 0; i < count; ++i) acc[i] = acc[i] * inverse;
    return;
  }
  const auto divisor = static_cast<float>(n);
  for (size_t i = 0; i < count; ++i) acc[i] = acc[i] / divisor;
}

void parallelDecodeSum(const CodecKernels& kernels, const SumJob& sum, float* output, bool stream,
                       int threads) {
  const int pieces = piecesFor(sum.count, threads);
  const DecodeSumContext context{&kernels, &sum, output, stream, pieces};
  runPieces(pieces, decodeSumPiece, &context);
}

bool parallelEncodeSum(const CodecKernels& kernels, const SumJob& sum, EncodeFn encode,
                       const EncodeJob& job, int threads, const Bf16Residual* bf16) {
  const int pieces = piecesFor(sum.count, threads);
  std::atomic<bool> finite{true};
  const EncodeSumContext context{&kernels, &sum, encode, &job, pieces, &finite, bf16};
  runPieces(pieces, encodeSumPiece, &context);
  return finite.load(std::memory_order_relaxed);
}

int affinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

void setLocalRanks(int localRanks) {
  int seen = gLocalRanks.load();
  while (localRanks > seen && !gLocalRanks.compare_exchange_weak(seen, localRanks)) {
  }
}

void setCodecThreads(int threads) { gOverride.store(std::clamp(threads, 0, kMaxThreads)); }

// The ranks per host a launcher announces (torchrun, Open MPI, MPICH,
// Slurm); 1 when none does. Communicators built over MPI have no rendezvous
// of their own to count local ranks with, so this is what they go by.
int launcherLocalRanks() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                           "SLURM_NTASKS_PER_NODE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (end != value && *end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
  }
  return 1;
}

int codecThreads() {
  if (const int forced = gOverride.load(); forced > 0) return forced;
  if (const int fromEnv = paramThreads(); fromEnv > 0) return fromEnv;
  static const int cores = affinityCores();
  // A communicator counted the ranks that share this rank's cores. Without
  // one, the launcher's count covers the whole host; a rank whose affinity
  // times that count fits in the host was bound to its own share, which is
  // not divided again.
  static const int launcher = [] {
    const int announced = launcherLocalRanks();
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 && static_cast<long>(affinityCores()) * announced <= online ? 1 : announced;
  }();
  const int counted = gLocalRanks.load();
  const int local = std::max(1, counted > 0 ? counted : launcher);
  return std::clamp(cores / local, 1, kMaxThreads);
}

size_t minElementsPerThread() {
  static const size_t minimum = [] {
    const int64_t v = paramInt(Param::kCodecThreadMinElements);
    return v >= static_cast<int64_t>(kElementUnit) ? static_cast<size_t>(v) : kElementUnit;
  }();
  return minimum;
}

int piecesFor(size_t count, int threads) {
  const size_t byWork = count / minElementsPerThread();
  return static_cast<int>(std::clamp<size_t>(byWork, 1, static_cast<size_t>(std::max(threads, 1))));
}

void widenBf16(const uint16_t* from, float* to, size_t n) {
  activeKernels().widenBf16(from, to, n);
}

void narrowToBf16(const float* from, uint16_t* to, size_t n) {
  activeKernels().narrowToBf16(from, to, n);
}

bool parallelEncode(EncodeFn fn, const EncodeJob& job, int threads, const Bf16Residual* bf16) {
  const int pieces = piecesFor(job.count, threads);
  if (pieces <= 1 && bf16 == nullptr) return fn(job);
  std::atomic<bool> finite{true};
  const EncodeContext context{fn, &job, pieces, &finite, bf16};
  runPieces(pieces, encodePiece, &context);
  return finite.load(std::memory_order_relaxed);
}

void parallelDecode(DecodeFn fn, const DecodeJob& job, int threads) {
  const int pieces = piecesFor(job.count, threads);
  if (pieces <= 1) {
    fn(job);
    return;
  }
  const DecodeContext context{fn, &job, pieces};
  runPieces(pieces, decodePiece, &context);
}

}  // namespace squall::codec
