/* An MPI_THREAD_MULTIPLE program whose threads reduce on different
 * communicators, in opposite orders on the two ranks: rank 0's first thread
 * reduces on X while rank 1's reduces on Y, and each rank's second thread then
 * joins the other communicator. An interposer that serialised every
 * communicator behind one lock would deadlock here (each rank's first thread
 * holding it, waiting for the other rank's second); SIGALRM turns that into a
 * failure. Each rank checks every result against PMPI_Allreduce's within the
 * 1-bit codec's error. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { kCount = 4096, kCalls = 3 };
static int rank_;

typedef struct {
  MPI_Comm comm;
  int delayMs;
  int failed;
} Work;

static void* reduce(void* arg) {
  Work* w = arg;
  struct timespec pause = {0, w->delayMs * 1000L * 1000L};
  nanosleep(&pause, NULL);
  float* in = malloc(3 * kCount * sizeof(float));
  float *out = in + kCount, *exact = in + 2 * kCount;
  for (int call = 0; call < kCalls; ++call) {
    for (int i = 0; i < kCount; ++i) in[i] = (float)((i * 7 + rank_ * 13 + call) % 17) - 8.0f;
    if (MPI_Allreduce(in, out, kCount, MPI_FLOAT, MPI_SUM, w->comm) != MPI_SUCCESS ||
        PMPI_Allreduce(in, exact, kCount, MPI_FLOAT, MPI_SUM, w->comm) != MPI_SUCCESS) {
      w->failed = 1;
      break;
    }
    double err = 0, norm = 0;
    for (int i = 0; i < kCount; ++i) {
      err += (out[i] - exact[i]) * (double)(out[i] - exact[i]);
      norm += exact[i] * (double)exact[i];
    }
    /* 1-bit with error feedback: the first calls' error is of the order of
     * the signal itself, never far beyond it. */
    if (!(sqrt(err) <= 1.5 * sqrt(norm))) {
      fprintf(stderr, "rank %d: call %d: error %g against a norm of %g\n", rank_, call, sqrt(err),
              sqrt(norm));
      w->failed = 1;
    }
  }
  free(in);
  return NULL;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  if (provided < MPI_THREAD_MULTIPLE) {
    fprintf(stderr, "FAILED: this MPI does not provide MPI_THREAD_MULTIPLE\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  alarm(45); /* a deadlock fails the test instead of hanging it */
  MPI_Comm x, y;
  MPI_Comm_dup(MPI_COMM_WORLD, &x);
  MPI_Comm_dup(MPI_COMM_WORLD, &y);
  Work first = {rank_ == 0 ? x : y, 0, 0}, second = {rank_ == 0 ? y : x, 300, 0};
  pthread_t t1, t2;
  pthread_create(&t1, NULL, reduce, &first);
  pthread_create(&t2, NULL, reduce, &second);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  if (first.failed || second.failed) {
    fprintf(stderr, "rank %d: FAILED\n", rank_);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_free(&x);
  MPI_Comm_free(&y);
  printf("rank %d: mpi_threads ok\n", rank_);
  MPI_Finalize();
  return 0;
}
