/*
 * Ping-pong latency, streaming bandwidth and message rate between ranks 0 and 1 (other
 * ranks idle), OSU-style:
 *   lat SIZE USEC       half round trip, averaged over ITERS round trips
 *   bw SIZE MBPS        WINDOW non-blocking sends per window, one ack per window
 *   rate SIZE MSGPS     the same with WINDOW_RATE messages per window, in messages/s
 * Usage: ringbtl_perf [SIZE...] (default 8 65536 1048576 4194304). Each measure is preceded
 * by untimed warm-up iterations. MB = 10^6 bytes.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64
#define WINDOW_RATE 256

/* About `budget` bytes moved per measure, at least `lo` and at most `hi` repetitions. */
static int iters_for(size_t n, double budget, int lo, int hi)
{
    double k = budget / (double) (n + 1);
    return k < lo ? lo : (k > hi ? hi : (int) k);
}

int main(int argc, char **argv)
{
    size_t sizes[32];
    int nsizes = 0, rank, nprocs;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    for (int i = 1; i < argc && nsizes < 32; i++) sizes[nsizes++] = strtoull(argv[i], NULL, 0);
    if (nsizes == 0) {
        size_t d[] = {8, 65536, 1048576, 4194304};
        for (int i = 0; i < 4; i++) sizes[nsizes++] = d[i];
    }
    size_t maxn = 0;
    for (int i = 0; i < nsizes; i++) maxn = sizes[i] > maxn ? sizes[i] : maxn;
    char *buf = malloc(maxn * WINDOW + 1);
    char *rbuf = malloc(maxn * WINDOW + 1);
    MPI_Request rq[WINDOW_RATE];
    char ack = 0;
    memset(buf, 1, maxn * WINDOW + 1);
    const int peer = rank == 0 ? 1 : 0;

    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        /* latency */
        int iters = iters_for(n, 2e8, 20, 10000), warm = iters / 10 + 10;
        double t0 = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank < 2) {
            for (int i = 0; i < iters + warm; i++) {
                if (i == warm) t0 = MPI_Wtime();
                if (rank == 0) {
                    MPI_Send(buf, (int) n, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
                    MPI_Recv(rbuf, (int) n, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(rbuf, (int) n, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int) n, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
                }
            }
            if (rank == 0)
                printf("lat %zu %.3f\n", n, (MPI_Wtime() - t0) * 1e6 / (2.0 * iters));
        }
        /* bandwidth (window of distinct buffers) and message rate */
        for (int mode = 0; mode < 2; mode++) {
            int win = mode == 0 ? WINDOW : WINDOW_RATE;
            if (mode == 1 && n > 65536) continue;
            int loops = mode == 0 ? iters_for(n * WINDOW, 2e9, 4, 200) : 200, wl = loops / 10 + 2;
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank >= 2) continue;
            for (int l = 0; l < loops + wl; l++) {
                if (l == wl) t0 = MPI_Wtime();
                for (int w = 0; w < win; w++) {
                    size_t off = mode == 0 ? (size_t) w * n : 0;
                    if (rank == 0)
                        MPI_Isend(buf + off, (int) n, MPI_CHAR, 1, 2, MPI_COMM_WORLD, &rq[w]);
                    else
                        MPI_Irecv(rbuf + off, (int) n, MPI_CHAR, 0, 2, MPI_COMM_WORLD, &rq[w]);
                }
                MPI_Waitall(win, rq, MPI_STATUSES_IGNORE);
                if (rank == 0)
                    MPI_Recv(&ack, 1, MPI_CHAR, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                else
                    MPI_Send(&ack, 1, MPI_CHAR, 0, 3, MPI_COMM_WORLD);
            }
            double dt = MPI_Wtime() - t0;
            if (rank == 0) {
                double msgs = (double) loops * win;
                if (mode == 0)
                    printf("bw %zu %.1f\n", n, msgs * (double) n / dt / 1e6);
                else
                    printf("rate %zu %.0f\n", n, msgs / dt);
            }
        }
        fflush(stdout);
    }
    free(buf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
