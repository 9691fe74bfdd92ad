/*
 * Message rate and bandwidth under MPI_THREAD_MULTIPLE (osu_mbw_mr's pattern, THREADS
 * threads on rank 0): thread t of rank 0 sends windows of WINDOW messages of SIZE bytes
 * to thread t of rank 1 + t % (N - 1) (tag t), which posts the window's receives, waits,
 * checks every byte of every message and answers with a 4-byte message; all threads at
 * once. With 2 ranks every thread sends to rank 1; with N ranks, threads send to
 * different peers. Rank 0 prints
 *     mt THREADS SIZE MSGS_PER_S MB_PER_S
 * over all threads (MB = 10^6 bytes), and "ringbtl_mt: OK" once every byte was checked.
 *
 * Usage: mpirun -np N ringbtl_mt THREADS SIZE [WINDOWS]    (N >= 2)
 */
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define WINDOW 64
#define WARMUP 10
#define MAX_THREADS 16

static int rank, np, threads, windows;
static size_t size;

static unsigned char pattern(int t, int m, size_t j)
{
    return (unsigned char) (t * 53 + m * 11 + (int) (j % 241));
}

static void *worker(void *arg)
{
    const int t = (int) (long) arg;
    const int peer = 1 + t % (np - 1);
    unsigned char *buf = malloc(size * WINDOW + 1);
    MPI_Request req[WINDOW];
    int ack = 0;
    if (buf == NULL) MPI_Abort(MPI_COMM_WORLD, 2);
    if (rank == 0) {
        for (int m = 0; m < WINDOW; m++)
            for (size_t j = 0; j < size; j++) buf[m * size + j] = pattern(t, m, j);
    }
    for (int w = 0; w < WARMUP + windows; w++) {
        if (rank == 0) {
            for (int m = 0; m < WINDOW; m++)
                MPI_Isend(buf + m * size, (int) size, MPI_BYTE, peer, t, MPI_COMM_WORLD, &req[m]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_INT, peer, t, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int m = 0; m < WINDOW; m++)
                MPI_Irecv(buf + m * size, (int) size, MPI_BYTE, 0, t, MPI_COMM_WORLD, &req[m]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            for (int m = 0; m < WINDOW; m++) {
                for (size_t j = 0; j < size; j++) {
                    if (buf[m * size + j] != pattern(t, m, j)) {
                        fprintf(stderr, "ringbtl_mt: thread %d window %d message %d byte %zu "
                                        "differs\n", t, w, m, j);
                        MPI_Abort(MPI_COMM_WORLD, 1);
                    }
                }
                for (size_t j = 0; j < size; j++) buf[m * size + j] = 0;
            }
            MPI_Send(&ack, 1, MPI_INT, 0, t, MPI_COMM_WORLD);
        }
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided;
    pthread_t th[MAX_THREADS];
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (provided != MPI_THREAD_MULTIPLE || np < 2 || argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N ringbtl_mt THREADS SIZE [WINDOWS] "
                            "(MPI_THREAD_MULTIPLE needed)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    threads = atoi(argv[1]);
    size = (size_t) atol(argv[2]);
    windows = argc > 3 ? atoi(argv[3]) : (size <= 8192 ? 400 : 40);
    if (threads < 1 || threads > MAX_THREADS || size < 1 || windows < 1) MPI_Abort(MPI_COMM_WORLD, 2);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    /* Rank 0 runs every thread; rank r those that send to it. */
    bool mine[MAX_THREADS];
    for (long t = 0; t < threads; t++) {
        mine[t] = rank == 0 || 1 + t % (np - 1) == rank;
        if (mine[t]) pthread_create(&th[t], NULL, worker, (void *) t);
    }
    for (int t = 0; t < threads; t++)
        if (mine[t]) pthread_join(th[t], NULL);
    double dt = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        /* Warm-up windows included in neither count nor time would need a barrier per
         * thread; they are counted: WARMUP of WARMUP + windows. */
        double msgs = (double) threads * (WARMUP + windows) * WINDOW;
        printf("mt %d %zu %.0f %.1f\n", threads, size, msgs / dt, msgs * (double) size / dt / 1e6);
        printf("ringbtl_mt: OK (%d threads, %zu B, every byte checked)\n", threads, size);
    }
    MPI_Finalize();
    return 0;
}
