/* Full-mesh exchange under MPI: every rank sends one small message to every other rank
 * and receives one from each, so that every pair of ranks is connected (Open MPI's btl
 * tcp connects lazily, on the first message of a pair). Prints, on rank 0, the slowest
 * rank's times:
 *   init      from just before MPI_Init to its return (launcher key-value exchange);
 *   exchange  the first full-mesh exchange after a barrier (every connection made);
 *   warm      a second full-mesh exchange (connections up: the exchange alone).
 * Each message carries the sender's rank and is checked. Used by tools/wireup-compare.sh
 * beside `ringbtl-bench alltoall`.
 *
 * Build: mpicc -O2 -o fullmesh tools/fullmesh.c */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One exchange with every other rank; returns the number of wrong messages. */
static int exchange(int rank, int size, int *in, int *out, MPI_Request *reqs)
{
    int n = 0, bad = 0;
    for (int i = 1; i < size; i++) {
        int src = (rank - i + size) % size;
        MPI_Irecv(&in[src], 1, MPI_INT, src, 7, MPI_COMM_WORLD, &reqs[n++]);
    }
    for (int i = 1; i < size; i++) {
        int dst = (rank + i) % size;
        out[dst] = rank;
        MPI_Isend(&out[dst], 1, MPI_INT, dst, 7, MPI_COMM_WORLD, &reqs[n++]);
    }
    MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
    for (int i = 0; i < size; i++)
        if (i != rank && in[i] != i)
            bad++;
    return bad;
}

int main(int argc, char **argv)
{
    double t0 = now_s();
    MPI_Init(&argc, &argv);
    double t_init = now_s() - t0;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int *in = calloc((size_t)size, sizeof(int));
    int *out = calloc((size_t)size, sizeof(int));
    MPI_Request *reqs = calloc(2 * (size_t)size, sizeof(MPI_Request));
    if (!in || !out || !reqs) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* The barrier runs over the ring/tree connections only, not every pair. */
    MPI_Barrier(MPI_COMM_WORLD);
    double t1 = now_s();
    int bad = exchange(rank, size, in, out, reqs);
    double t_first = now_s() - t1;
    MPI_Barrier(MPI_COMM_WORLD);
    double t2 = now_s();
    bad += exchange(rank, size, in, out, reqs);
    double t_warm = now_s() - t2;
    double mine[3] = {t_init, t_first, t_warm}, max[3];
    int bad_all = 0;
    MPI_Reduce(mine, max, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&bad, &bad_all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("fullmesh: %d ranks, init %.3f ms, exchange %.3f ms, warm %.3f ms "
               "(slowest rank), %d wrong message(s)\n",
               size, max[0] * 1e3, max[1] * 1e3, max[2] * 1e3, bad_all);
    }
    free(in);
    free(out);
    free(reqs);
    MPI_Finalize();
    return bad_all != 0;
}
