/*
 * The exchanges MPI applications run, timed at every rank, against any MPI library:
 *   xchg SIZE   pairs (rank r with r ^ 1) exchange SIZE bytes both ways at once
 *               (MPI_Sendrecv, the halo pattern of one neighbour)
 *   halo2 SIZE  every rank exchanges SIZE bytes with its 2 ring neighbours at once
 *   halo4 SIZE  the same with 4 neighbours (r +- 1, r +- 2; at least 5 ranks)
 *   a2a SIZE    MPI_Alltoall of SIZE bytes per pair
 *   ovl SIZE    overlap: pairs (r with r ^ 1) post MPI_Irecv and MPI_Isend of SIZE bytes,
 *               compute (spin on the clock, no MPI call) for 1.5 times the exchange's own
 *               time, then MPI_Waitall; prints "ovl SIZE PCT", the share of the exchange's
 *               time hidden behind the computation, (t_xchg + t_compute - t_total) / t_xchg
 *               in per cent (0-100), medians of the iterations, the lowest of the ranks
 * Each measure prints one line at rank 0: "PATTERN SIZE MBPS", the bytes one rank sends
 * per second (MB = 10^6), the slowest rank's time (the time of the exchange: every rank
 * waits for its slowest neighbour). Every received byte is checked after the timed loop
 * (each message carries its sender, iteration and offset pattern); a wrong byte aborts.
 *
 * Usage: ringbtl_patterns [-f] [-c US] PATTERN[,PATTERN...] SIZE...
 *   -f  fresh buffers: each iteration sends from and receives into another part of an
 *       arena of 64 MiB or 8 messages per neighbour, whichever is larger, so no buffer is
 *       reused while it is cache-hot or still registered (default: the same buffers)
 *   -c  ovl computes for US microseconds, the same for every library compared, and also
 *       prints "ovl-time SIZE T": T, the slowest rank's median time in us from the posts
 *       to the end of MPI_Waitall (with the default, a library whose exchange is slow
 *       computes longer, and hides more of it)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_NB 4
#define MAX_SIZES 32

static int rank, nprocs;
/* -c: the computation of ovl, in us (0: 1.5 times the exchange's own time). */
static double compute_us;

/* About `budget` bytes sent per measure, at least `lo` and at most `hi` iterations. */
static int iters_for(size_t n, double budget, int lo, int hi)
{
    double k = budget / (double) (n + 1);
    return k < lo ? lo : (k > hi ? hi : (int) k);
}

static unsigned char byte_of(int from, int it, size_t off)
{
    return (unsigned char) (from * 131 + it * 31 + off * 7 + (off >> 8));
}

static void fill(unsigned char *p, size_t n, int from, int it)
{
    for (size_t i = 0; i < n; i++) p[i] = byte_of(from, it, i);
}

static void check(const unsigned char *p, size_t n, int from, int it, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != byte_of(from, it, i)) {
            fprintf(stderr, "ringbtl_patterns: %s: rank %d got byte %zu of %zu from rank %d "
                    "wrong (iteration %d)\n", what, rank, i, n, from, it);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
}

/* The neighbours of `rank` in a pattern, or 0 when the pattern cannot run at nprocs. */
static int neighbours(const char *pat, int nb[MAX_NB])
{
    if (!strcmp(pat, "xchg")) {
        if ((rank ^ 1) >= nprocs) return 0;
        nb[0] = rank ^ 1;
        return 1;
    }
    if (!strcmp(pat, "halo2") && nprocs >= 3) {
        nb[0] = (rank + 1) % nprocs;
        nb[1] = (rank + nprocs - 1) % nprocs;
        return 2;
    }
    if (!strcmp(pat, "halo4") && nprocs >= 5) {
        nb[0] = (rank + 1) % nprocs;
        nb[1] = (rank + nprocs - 1) % nprocs;
        nb[2] = (rank + 2) % nprocs;
        nb[3] = (rank + nprocs - 2) % nprocs;
        return 4;
    }
    return 0;
}

/* Seconds on the monotonic clock, read without entering MPI. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

/* The median time of `iters` exchanges with `peer` (after 3 unmeasured), each: a
 * barrier, MPI_Irecv and MPI_Isend of n bytes, `secs` of computation, MPI_Waitall. */
static double overlap_round(unsigned char *sb, unsigned char *rb, size_t n, int peer,
                            double secs, int iters, double *t)
{
    for (int it = 0; it < iters + 3; it++) {
        MPI_Request rq[2];
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Irecv(rb, (int) n, MPI_BYTE, peer, 9, MPI_COMM_WORLD, &rq[0]);
        MPI_Isend(sb, (int) n, MPI_BYTE, peer, 9, MPI_COMM_WORLD, &rq[1]);
        if (secs > 0) {
            volatile unsigned long spins = 0;
            while (now() - t0 < secs) spins++;
        }
        MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        if (it >= 3) t[it - 3] = now() - t0;
        check(rb, n, peer, 0, "ovl");
        memset(rb, 0, n);
    }
    qsort(t, (size_t) iters, sizeof(double), cmp_double);
    return t[iters / 2];
}

static void overlap(size_t n)
{
    int peer = rank ^ 1;
    if (peer >= nprocs) {
        if (rank == 0) fprintf(stderr, "ringbtl_patterns: ovl needs an even number of ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    unsigned char *sb = malloc(n), *rb = malloc(n);
    int iters = iters_for(n, 2e8, 20, 400);
    double *t = malloc(sizeof(double) * (size_t) iters);
    if (!sb || !rb || !t) {
        fprintf(stderr, "ringbtl_patterns: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fill(sb, n, rank, 0);
    memset(rb, 0, n);
    /* Every rank computes as long: 1.5 times the slowest rank's exchange, or -c's time,
     * the same whatever the library. */
    double xchg = overlap_round(sb, rb, n, peer, 0, iters, t), slowest;
    MPI_Allreduce(&xchg, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double secs = compute_us > 0 ? compute_us * 1e-6 : 1.5 * slowest;
    double total = overlap_round(sb, rb, n, peer, secs, iters, t);
    double pct = 100.0 * (xchg + secs - total) / xchg, lowest;
    pct = pct < 0 ? 0 : (pct > 100 ? 100 : pct);
    MPI_Reduce(&pct, &lowest, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    double longest;
    MPI_Reduce(&total, &longest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("ovl %zu %.1f\n", n, lowest);
        /* With -c, which library ends the computation and its exchange first: the
         * slowest rank's median time, us. */
        if (compute_us > 0) printf("ovl-time %zu %.1f\n", n, longest * 1e6);
        fflush(stdout);
    }
    free(t);
    free(sb);
    free(rb);
}

static void run(const char *pat, size_t n, int fresh)
{
    if (!strcmp(pat, "ovl")) {
        overlap(n);
        return;
    }
    int nb[MAX_NB], k = 0, a2a = !strcmp(pat, "a2a");
    if (a2a) {
        k = nprocs;
    } else if ((k = neighbours(pat, nb)) == 0) {
        if (rank == 0) fprintf(stderr, "ringbtl_patterns: %s cannot run at %d ranks\n", pat, nprocs);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* One slot per neighbour and iteration in flight; fresh: enough slots to cycle. */
    size_t slot = n * (size_t) k;
    size_t nslots = 1;
    if (fresh) {
        nslots = (64u << 20) / (slot + 1);
        if (nslots < 8) nslots = 8;
    }
    unsigned char *sb = malloc(slot * nslots + 1), *rb = malloc(slot * nslots + 1);
    if (!sb || !rb) {
        fprintf(stderr, "ringbtl_patterns: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int iters = iters_for(slot, 4e8, 10, 2000), warm = iters / 10 + 3;
    /* The send data of every slot, once (the check needs each iteration's pattern: the
     * iteration number in the pattern is the slot's). */
    for (size_t s = 0; s < nslots; s++)
        for (int j = 0; j < k; j++) fill(sb + s * slot + (size_t) j * n, n, rank, (int) s);
    memset(rb, 0, slot * nslots);
    MPI_Request rq[2 * MAX_NB];
    double t0 = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int it = 0; it < warm + iters; it++) {
        if (it == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        size_t s = fresh ? (size_t) it % nslots : 0;
        unsigned char *sp = sb + s * slot, *rp = rb + s * slot;
        if (a2a) {
            MPI_Alltoall(sp, (int) n, MPI_BYTE, rp, (int) n, MPI_BYTE, MPI_COMM_WORLD);
        } else if (k == 1) {
            MPI_Sendrecv(sp, (int) n, MPI_BYTE, nb[0], 7, rp, (int) n, MPI_BYTE, nb[0], 7,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int j = 0; j < k; j++)
                MPI_Irecv(rp + (size_t) j * n, (int) n, MPI_BYTE, nb[j], 8 + j, MPI_COMM_WORLD, &rq[j]);
            /* Neighbour j's message to us is the one it sends to its neighbour j ^ 1 (the
             * opposite direction), so tags pair up: ours to nb[j] goes with tag 8 + (j ^ 1). */
            for (int j = 0; j < k; j++)
                MPI_Isend(sp + (size_t) j * n, (int) n, MPI_BYTE, nb[j], 8 + (j ^ 1), MPI_COMM_WORLD,
                          &rq[k + j]);
            MPI_Waitall(2 * k, rq, MPI_STATUSES_IGNORE);
        }
    }
    double dt = MPI_Wtime() - t0, slowest;
    MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    /* Every slot that was received: last written in iteration it, slot it % nslots. */
    size_t used = fresh ? ((size_t) (warm + iters) < nslots ? (size_t) (warm + iters) : nslots) : 1;
    for (size_t s = 0; s < used; s++)
        for (int j = 0; j < k; j++) {
            int from = a2a ? j : nb[j];
            check(rb + s * slot + (size_t) j * n, n, from, (int) s, pat);
        }
    if (rank == 0) {
        double sent = (double) iters * (double) n * (a2a ? nprocs - 1 : k);
        printf("%s%s %zu %.1f\n", pat, fresh ? "-fresh" : "", n, sent / slowest / 1e6);
        fflush(stdout);
    }
    free(sb);
    free(rb);
}

int main(int argc, char **argv)
{
    int fresh = 0, a = 1, nsizes = 0;
    size_t sizes[MAX_SIZES];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "-f")) {
            fresh = 1;
        } else if (!strcmp(argv[a], "-c") && a + 1 < argc && atof(argv[a + 1]) > 0) {
            compute_us = atof(argv[++a]);
        } else {
            a = argc;
        }
    }
    if (a >= argc) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: ringbtl_patterns [-f] [-c US] PATTERN[,PATTERN...] SIZE...\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char *pats = argv[a++];
    for (; a < argc && nsizes < MAX_SIZES; a++) {
        char *end;
        unsigned long long v = strtoull(argv[a], &end, 0);
        if (*end || v == 0 || v > (1ull << 30)) {
            if (rank == 0) fprintf(stderr, "ringbtl_patterns: bad size '%s'\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        sizes[nsizes++] = (size_t) v;
    }
    for (char *p = strtok(pats, ","); p; p = strtok(NULL, ","))
        for (int s = 0; s < nsizes; s++) run(p, sizes[s], fresh);
    MPI_Finalize();
    return 0;
}
