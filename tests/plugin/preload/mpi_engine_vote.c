/* A rank whose Squall engine cannot start while the others' can: MPI is
 * initialised at MPI_THREAD_SINGLE and rank 1 makes its calls from a second
 * thread (the main one waits for it, so the calls stay serialised), where
 * Squall's MPI transport refuses to run. Every rank must then pass the calls
 * through to MPI; before the ranks agreed, rank 0 compressed while rank 1 did
 * not, and their collectives no longer matched (a hang, which SIGALRM turns
 * into a failure). Each result is checked bit for bit against
 * PMPI_Allreduce. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kCount = 4096, kCalls = 4 };
static int rank_, failed_;

static void* reduce(void* arg) {
  (void)arg;
  float* in = malloc(3 * kCount * sizeof(float));
  float *out = in + kCount, *exact = in + 2 * kCount;
  for (int call = 0; call < kCalls && !failed_; ++call) {
    for (int i = 0; i < kCount; ++i) in[i] = (float)((i * 7 + rank_ * 13 + call) % 17) - 8.0f;
    if (MPI_Allreduce(in, out, kCount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS ||
        PMPI_Allreduce(in, exact, kCount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS ||
        memcmp(out, exact, kCount * sizeof(float)) != 0) {
      fprintf(stderr, "rank %d: call %d failed or differs from PMPI_Allreduce\n", rank_, call);
      failed_ = 1;
    }
  }
  free(in);
  return NULL;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  alarm(45); /* mismatched collectives hang: fail instead */
  if (rank_ == 1) {
    pthread_t t;
    pthread_create(&t, NULL, reduce, NULL);
    pthread_join(t, NULL);
  } else {
    reduce(NULL);
  }
  if (failed_) MPI_Abort(MPI_COMM_WORLD, 1);
  printf("rank %d: mpi_engine_vote ok\n", rank_);
  MPI_Finalize();
  return 0;
}
