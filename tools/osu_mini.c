/*
 * osu_mini: the three OSU point-to-point measurements ringbtl-bench makes, written
 * against plain MPI so that any MPI library (Open MPI's TCP BTL in
 * tools/perf-compare.sh) is measured the same way, between ranks 0 and 1.
 *
 *   latency  ping-pong, one-way latency = round trip / 2 (osu_latency), the average
 *            and (JSON) the median round trip / 2;
 *            10000 iterations after 100 warm-up up to 8 KiB, 1000 after 10 above
 *   bw       windows of 64 MPI_Isend, MPI_Waitall, then a 4-byte acknowledgement
 *            (osu_bw); MB/s = size x window x loops / 10^6 / seconds;
 *            100 windows after 10 up to 8 KiB, 20 after 2 above
 *   rate     the same windows, reported as MB/s and messages/s (osu_mbw_mr, one pair)
 *   bw and rate first stream about 2 GB (200 MB with -q) of the largest size, untimed,
 *   as ringbtl-bench's --prewarm does: a fresh process and connection stream large
 *   messages markedly slower for their first gigabytes on the machines measured.
 *
 * Usage: osu_mini latency|bw|rate [-s SIZE[,SIZE...]] [-q] [-j]
 *   -s  sizes in bytes (default 1, 2, 4 ... 4 MiB; 0 allowed for latency)
 *   -q  divide the iteration and warm-up counts by 10
 *   -j  one JSON object per line instead of the OSU table
 *
 * Build: mpicc -O2 -o osu_mini osu_mini.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZE (4 << 20)
#define MAX_SIZES 64
#define LARGE 8192
#define WINDOW 64
#define ACK 4

static int rank;

static long parse_size(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end != '\0' || v < 0 || v > MAX_SIZE)
        return -1;
    return v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One-way latency in us (round trip / 2), the average over `iters` after `skip`; the
 * median of the round trips (halved) in *p50, on rank 0. */
static double latency(char *sbuf, char *rbuf, int size, int iters, int skip, double *p50)
{
    double t0 = 0.0, t = 0.0;
    double *rt = malloc(sizeof(double) * (size_t)iters);
    if (!rt)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters + skip; i++) {
        if (i == skip)
            t0 = MPI_Wtime();
        if (rank == 0) {
            double a = MPI_Wtime();
            MPI_Send(sbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(rbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (i >= skip)
                rt[i - skip] = MPI_Wtime() - a;
        } else {
            MPI_Recv(rbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
    }
    t = (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
    *p50 = 0.0;
    if (rank == 0 && iters > 0) {
        qsort(rt, (size_t)iters, sizeof(double), cmp_double);
        *p50 = rt[iters / 2] * 1e6 / 2.0;
    }
    free(rt);
    return t;
}

/* Seconds rank 0 spent on `loops` windows after `skip` (0 on rank 1). */
static double windows(char *sbuf, char *rbuf, int size, int loops, int skip)
{
    MPI_Request req[WINDOW];
    double t0 = 0.0, t = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < loops + skip; i++) {
        if (rank == 0) {
            if (i == skip)
                t0 = MPI_Wtime();
            for (int j = 0; j < WINDOW; j++)
                MPI_Isend(sbuf, size, MPI_CHAR, 1, 100, MPI_COMM_WORLD, &req[j]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Recv(rbuf, ACK, MPI_CHAR, 1, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int j = 0; j < WINDOW; j++)
                MPI_Irecv(rbuf, size, MPI_CHAR, 0, 100, MPI_COMM_WORLD, &req[j]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Send(sbuf, ACK, MPI_CHAR, 0, 101, MPI_COMM_WORLD);
        }
    }
    if (rank == 0)
        t = MPI_Wtime() - t0;
    return t;
}

int main(int argc, char **argv)
{
    long sizes[MAX_SIZES];
    int nsizes = 0, quick = 0, json = 0, nprocs;
    const char *test = argc > 1 ? argv[1] : "";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    int is_lat = !strcmp(test, "latency"), is_bw = !strcmp(test, "bw"),
        is_rate = !strcmp(test, "rate");
    int bad = !(is_lat || is_bw || is_rate) || nprocs != 2;
    for (int a = 2; a < argc && !bad; a++) {
        if (!strcmp(argv[a], "-q")) {
            quick = 1;
        } else if (!strcmp(argv[a], "-j")) {
            json = 1;
        } else if (!strcmp(argv[a], "-s") && a + 1 < argc) {
            char *list = argv[++a];
            for (char *tok = strtok(list, ","); tok && !bad; tok = strtok(NULL, ",")) {
                long v = parse_size(tok);
                if (v < 0 || nsizes == MAX_SIZES || (v == 0 && !is_lat))
                    bad = 1;
                else
                    sizes[nsizes++] = v;
            }
        } else {
            bad = 1;
        }
    }
    if (bad) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 osu_mini latency|bw|rate "
                            "[-s SIZE[,SIZE...]] [-q] [-j]\n");
        MPI_Finalize();
        return 2;
    }
    if (nsizes == 0)
        for (long s = 1; s <= MAX_SIZE; s *= 2)
            sizes[nsizes++] = s;

    char *sbuf = malloc(MAX_SIZE), *rbuf = malloc(MAX_SIZE);
    if (!sbuf || !rbuf)
        MPI_Abort(MPI_COMM_WORLD, 1);
    memset(sbuf, 0xa5, MAX_SIZE);
    memset(rbuf, 0, MAX_SIZE);

    int div = quick ? 10 : 1;
    if (rank == 0 && !json) {
        if (is_lat)
            printf("# OSU-style MPI Latency Test (osu_mini)\n%-10s%20s\n", "# Size",
                   "Latency (us)");
        else if (is_bw)
            printf("# OSU-style MPI Bandwidth Test (osu_mini)\n%-10s%20s\n", "# Size",
                   "Bandwidth (MB/s)");
        else
            printf("# OSU-style MPI Multiple Bandwidth / Message Rate Test (osu_mini)\n"
                   "# [ pairs: 1 ] [ window size: %d ]\n%-10s%20s%20s\n",
                   WINDOW, "# Size", "MB/s", "Messages/s");
    }
    if (!is_lat) {
        long largest = 1;
        for (int k = 0; k < nsizes; k++)
            largest = sizes[k] > largest ? sizes[k] : largest;
        long budget = (quick ? 200L : 2048L) << 20;
        long n = (budget + largest * WINDOW - 1) / (largest * WINDOW);
        windows(sbuf, rbuf, (int)largest, 1, (int)(n < 200 ? n : 200) - 1);
    }
    for (int k = 0; k < nsizes; k++) {
        int size = (int)sizes[k];
        if (is_lat) {
            int iters = (size <= LARGE ? 10000 : 1000) / div;
            int skip = (size <= LARGE ? 100 : 10) / div;
            double p50;
            double us = latency(sbuf, rbuf, size, iters, skip, &p50);
            if (rank == 0 && json)
                printf("{\"bench\":\"latency\",\"size\":%d,\"iters\":%d,\"avg_us\":%.3f,"
                       "\"p50_us\":%.3f}\n",
                       size, iters, us, p50);
            else if (rank == 0)
                printf("%-10d%20.2f\n", size, us);
        } else {
            int loops = (size <= LARGE ? 100 : 20) / div;
            int skip = (size <= LARGE ? 10 : 2) / div;
            if (loops < 1)
                loops = 1;
            double t = windows(sbuf, rbuf, size, loops, skip);
            double msgs = (double)WINDOW * loops;
            double mb = t > 0 ? size / 1e6 * msgs / t : 0, rate = t > 0 ? msgs / t : 0;
            if (rank == 0 && json)
                printf("{\"bench\":\"%s\",\"size\":%d,\"window\":%d,\"iters\":%d,"
                       "\"mb_s\":%.3f,\"msg_s\":%.3f}\n",
                       test, size, WINDOW, loops, mb, rate);
            else if (rank == 0 && is_bw)
                printf("%-10d%20.2f\n", size, mb);
            else if (rank == 0)
                printf("%-10d%20.2f%20.2f\n", size, mb, rate);
        }
        if (rank == 0)
            fflush(stdout);
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
