/*
 * MPI_THREAD_MULTIPLE over a BTL: every rank runs THREADS threads, thread t sending checked
 * messages of several sizes to rank + 1 + t and receiving from rank - 1 - t (tag t, modulo
 * the job's size), all threads at once: threads x peers x sizes, each thread with peers of
 * its own where the job has enough ranks (4 ranks: threads 0-2 one peer pair each, thread 3
 * itself). Exit status 0 and "ringbtl_threads: OK" on success.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define ROUNDS 200

static int rank, size;

static void *worker(void *arg)
{
    const int t = (int) (long) arg;
    static const int sizes[] = {8, 1000, 70000, 300000};
    const int to = (rank + 1 + t) % size, from = ((rank - 1 - t) % size + size) % size;
    unsigned char *out = malloc(300000), *in = malloc(300000);
    for (int r = 0; r < ROUNDS; r++) {
        int n = sizes[r % 4];
        for (int i = 0; i < n; i++) out[i] = (unsigned char) (rank * 31 + t * 7 + r + i);
        MPI_Sendrecv(out, n, MPI_BYTE, to, t, in, n, MPI_BYTE, from, t, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (int i = 0; i < n; i++) {
            if (in[i] != (unsigned char) (from * 31 + t * 7 + r + i)) {
                fprintf(stderr, "ringbtl_threads rank %d thread %d: round %d byte %d differs\n",
                        rank, t, r, i);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    free(out);
    free(in);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided;
    pthread_t th[THREADS];
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided != MPI_THREAD_MULTIPLE) {
        if (rank == 0) fprintf(stderr, "ringbtl_threads: MPI_THREAD_MULTIPLE not provided\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *) t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("ringbtl_threads: OK (%d ranks, %d threads each)\n", size, THREADS);
    MPI_Finalize();
    return 0;
}
