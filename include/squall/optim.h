/*
 * Squall optimizers: APMSqueeze (Adam with a full-precision warmup, then a
 * frozen variance and 1-bit compressed momentum) and SlowMo (periodic
 * synchronisation with slow momentum), over one flat fp32 parameter buffer
 * per optimizer object.
 *
 * Every rank creates the optimizer with the same count and configuration,
 * and calls squallOptimizerStep once per training step with its local
 * gradient. Ranks end every step with bit-identical parameters whenever the
 * mode communicates every step (sync, apmsqueeze), and after every SlowMo
 * synchronisation otherwise.
 */
#ifndef SQUALL_OPTIM_H_
#define SQUALL_OPTIM_H_

#include "squall/squall.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  squallModeApmSqueeze = 0, /* warmup: allreduced gradients into Adam; then 1-bit momentum */
  squallModeSync = 1,       /* Adam on the full-precision allreduced gradient every step */
  squallModeLocal = 2       /* Adam on the local gradient; no communication (use SlowMo) */
} squallOptimMode_t;

typedef enum {
  squallPhaseWarmup = 0,    /* APMSqueeze: full-precision Adam */
  squallPhaseCompressed = 1 /* APMSqueeze: frozen variance, compressed momentum */
} squallOptimPhase_t;

typedef enum {
  squallOptimAlgoBytes = 0,     /* fewer bytes: two-phase from 3 ranks on */
  squallOptimAlgoTwoPhase = 1,  /* reduce-scatter + all-gather, 2 (n-1)/n E per rank */
  squallOptimAlgoAllGather = 2, /* one round, (n-1) E per rank */
  squallOptimAlgoTime = 3       /* the communicator's alpha-beta time model */
} squallOptimAlgo_t;

typedef struct {
  size_t size; /* sizeof(squallOptimConfig_t) */
  squallOptimMode_t mode;
  float lr;
  float beta1, beta2, eps;
  float weightDecay;       /* decoupled (AdamW) */
  int64_t warmupSteps;     /* APMSqueeze: steps of full-precision Adam; < 0: use the fraction */
  double warmupFraction;   /* of totalSteps, when warmupSteps < 0 (the paper uses 0.15) */
  int64_t totalSteps;      /* planned steps; needed only with warmupFraction */
  squallCodecSpec_t codec; /* of the compressed momentum (and of compressed SlowMo syncs) */
  /* SlowMo: every slowmoTau steps (0 = off), average the parameters across ranks and
   * apply slow momentum: u = beta*u + (x_prev - x_avg)/lr; x_prev -= alpha*lr*u; x = x_prev. */
  int slowmoTau;
  float slowmoAlpha;
  float slowmoBeta;
  int slowmoCompressed; /* 1: the parameter average goes through the compressed allreduce */
  /* APMSqueeze compressed-stage guard (docs/optim.md, "The guard"). guard = 1 (default):
   * elements whose frozen v_hat is 0 (no gradient during the whole warmup) keep zero momentum
   * and do not move, and each element's m / (sqrt(v_hat) + eps) is clipped to +-maxUpdate.
   * guard = 0: the plain update x -= lr * m / (sqrt(v_hat) + eps). */
  int guard;
  /* With guard = 1. 0 (default): the largest |m_hat| / sqrt(v_hat) full-precision Adam can
   * reach with these betas, (1 - beta1) / sqrt((1 - beta2) (1 - beta1^2 / beta2)) = 7.27 for
   * (0.9, 0.999), and no clip when beta1^2 >= beta2; > 0: that bound. */
  float maxUpdate;
  /* APMSqueeze adaptive warmup (docs/optim.md, "When the warmup ends"). freezeThreshold > 0:
   * the warmup ends after the first step t, a multiple of freezeWindow and >= 2 freezeWindow,
   * where sum |v_hat_t - v_hat_(t - freezeWindow)| / sum v_hat_t < freezeThreshold (v_hat: the
   * bias-corrected second moment, the same on every rank, so every rank decides alike), and
   * at the latest after the fixed warmup (warmupSteps / warmupFraction), now an upper bound.
   * freezeThreshold = 0: the fixed warmup. */
  double freezeThreshold;
  int64_t freezeWindow;
  /* The algorithm of the host compressed allreduces (momentum, compressed SlowMo;
   * docs/optim.md, "Choosing the algorithm and the block size"): squallOptimAlgoBytes
   * (default) the one that sends fewer bytes, squallOptimAlgoTime the communicator's
   * latency/bandwidth model, or a fixed one. A fixed SQUALL_COMPRESSED_ALGO overrides the
   * two automatic choices. The device path always runs the two-phase algorithm. */
  int compressedAlgo;
  /* The APMSqueeze warmup's gradient average (docs/optim.md, "A cheaper warmup"):
   * squallCodecNone (fp32), squallCodecFp16 or squallCodecBf16 (each rank's gradient
   * rounded, summed in fp32, rounded again; stateless). */
  int warmupCodec;
} squallOptimConfig_t;

/* The optimizers' defaults (docs/convergence.md measures them, docs/optim.md explains
 * them): the adaptive warmup (threshold 0.2 over 8-step windows, the 15% fraction as the
 * upper bound), a bf16 warmup, and onebit momentum in 64-element blocks, each with the
 * scale that keeps its norm (RMS). */
#define SQUALL_OPTIM_FREEZE_THRESHOLD 0.2
#define SQUALL_OPTIM_FREEZE_WINDOW 8
#define SQUALL_OPTIM_WARMUP_CODEC squallCodecBf16
#define SQUALL_OPTIM_BLOCK_SIZE 64
#define SQUALL_OPTIM_SCALE squallScaleRms
#define SQUALL_OPTIM_CODEC_SPEC \
  { squallCodecOnebit, SQUALL_OPTIM_SCALE, SQUALL_OPTIM_BLOCK_SIZE }

#define SQUALL_OPTIM_CONFIG_INIT                                                                   \
  {                                                                                                \
    sizeof(squallOptimConfig_t), squallModeApmSqueeze, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, -1, 0.15, \
        0, SQUALL_OPTIM_CODEC_SPEC, 0, 1.0f, 0.5f, 0, 1, 0.0f, SQUALL_OPTIM_FREEZE_THRESHOLD,      \
        SQUALL_OPTIM_FREEZE_WINDOW, squallOptimAlgoBytes, SQUALL_OPTIM_WARMUP_CODEC                \
  }

typedef struct squallOptimizer* squallOptimizer_t;

typedef struct {
  int64_t step;             /* steps taken */
  squallOptimPhase_t phase; /* APMSqueeze phase */
  int64_t warmupSteps;      /* the warmup's length once frozen; before, its upper bound */
  uint64_t bytesSent;       /* by this rank over all steps, headers included */
  uint64_t skippedSteps;    /* compressed steps whose residuals were kept (non-finite input) */
} squallOptimInfo_t;

SQUALL_API squallResult_t squallOptimizerCreate(squallComm_t comm, size_t count,
                                                const squallOptimConfig_t* config,
                                                squallOptimizer_t* optimizer);
SQUALL_API squallResult_t squallOptimizerDestroy(squallOptimizer_t optimizer);

/* One step: updates `params` (count fp32 values, host memory) in place from this
 * rank's `grads`. lr > 0 overrides the configured learning rate for this step
 * (learning-rate schedules); lr <= 0 keeps it; a NaN or infinite lr is refused
 * (squallInvalidArgument, on every rank of the step). */
SQUALL_API squallResult_t squallOptimizerStep(squallOptimizer_t optimizer, float* params,
                                              const float* grads, float lr);

SQUALL_API squallResult_t squallOptimizerGetInfo(squallOptimizer_t optimizer,
                                                 squallOptimInfo_t* info);

/* State for checkpoints: a versioned, self-describing blob holding this rank's
 * m, frozen v, residuals, step, phase and SlowMo buffers. Loading a blob saved
 * with a different number of ranks keeps everything but the server residual,
 * which is reset with a warning (squallGetLastError is not set: it succeeds). */
SQUALL_API squallResult_t squallOptimizerStateSize(squallOptimizer_t optimizer, size_t* bytes);
SQUALL_API squallResult_t squallOptimizerSaveState(squallOptimizer_t optimizer, void* buffer,
                                                   size_t capacity, size_t* written);
SQUALL_API squallResult_t squallOptimizerLoadState(squallOptimizer_t optimizer, const void* buffer,
                                                   size_t bytes);

/* ---- Device buffers (CUDA) ------------------------------------------------
 * One step on device memory: `dParams` and `dGrads` are count fp32 values in
 * CUDA device memory, and the work is enqueued on `cudaStream` (a
 * cudaStream_t; NULL is the legacy default stream).
 *
 * On a communicator from squallCommInitFromNccl the optimizer lives on the
 * device: m, v and the SlowMo buffers are device memory, gradients are
 * averaged with ncclAllReduce, the compressed momentum goes through the
 * device compressed allreduce, and the results are bit-identical to
 * squallOptimizerStep on the same inputs. The call waits for the stream once
 * per step (twice on SlowMo synchronisations): the skip decision for
 * non-finite values is read on the host, so a step cannot be captured in a
 * CUDA graph. squallOptimizerStep is refused for such an optimizer.
 *
 * On a host communicator (TCP, UCX, MPI) the buffers are staged through host
 * memory: copy to the host, wait, squallOptimizerStep, copy back, wait.
 *
 * Without CUDA and NCCL in the build it returns squallUnsupported. */
SQUALL_API squallResult_t squallOptimizerStepOnStream(squallOptimizer_t optimizer, float* dParams,
                                                      const float* dGrads, float lr,
                                                      void* cudaStream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SQUALL_OPTIM_H_ */
