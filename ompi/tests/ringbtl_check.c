/*
 * Correctness check of a BTL under MPI: point-to-point at sizes around ob1's protocol
 * switch points (eager, rendezvous, pipelined), contiguous and strided datatypes,
 * synchronous sends, a flood of small messages from every rank (per-peer order,
 * MPI_ANY_SOURCE), and collectives. Every received byte is checked.
 *
 * Usage: ringbtl_check            the fixed sequence above
 *        ringbtl_check SECONDS    rounds of exchanges instead, for SECONDS (fractions allowed):
 *                                 each round every rank sends one message to every other
 *                                 rank and receives one from each, all in flight at once,
 *                                 the round's size taken in turn from a list (most of them
 *                                 no power of two). All ranks stop after the same round;
 *                                 rank 0 then prints the rounds and the longest one.
 *
 * Exit status 0 and "ringbtl_check: OK" on success; the first mismatch aborts the job.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

#define FAIL(...)                                                                          \
    do {                                                                                   \
        fprintf(stderr, "ringbtl_check rank %d: ", rank);                                  \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fprintf(stderr, "\n");                                                             \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    } while (0)

static unsigned char pattern(int src, size_t i, int round)
{
    return (unsigned char) ((size_t) src * 131u + i * 7u + (size_t) round * 29u + (i >> 9));
}

/* Ring exchange of `n` bytes: each rank sends to rank+1 and receives from rank-1. */
static void ring_bytes(size_t n, int round, int sync)
{
    unsigned char *out = malloc(n + 1), *in = malloc(n + 1);
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    MPI_Request rq;
    MPI_Status st;
    int count;
    if (!out || !in) FAIL("out of memory (%zu bytes)", n);
    for (size_t i = 0; i < n; i++) out[i] = pattern(rank, i, round);
    memset(in, 0xEE, n + 1);
    MPI_Irecv(in, (int) n + 1, MPI_BYTE, from, round, MPI_COMM_WORLD, &rq);
    if (sync)
        MPI_Ssend(out, (int) n, MPI_BYTE, to, round, MPI_COMM_WORLD);
    else
        MPI_Send(out, (int) n, MPI_BYTE, to, round, MPI_COMM_WORLD);
    MPI_Wait(&rq, &st);
    MPI_Get_count(&st, MPI_BYTE, &count);
    if ((size_t) count != n || st.MPI_SOURCE != from)
        FAIL("size %zu: got count %d from %d", n, count, st.MPI_SOURCE);
    for (size_t i = 0; i < n; i++)
        if (in[i] != pattern(from, i, round)) FAIL("size %zu: byte %zu differs", n, i);
    if (in[n] != 0xEE) FAIL("size %zu: wrote past the message", n);
    free(out);
    free(in);
}

/* A strided datatype (every other double) on both sides: the convertor packs it. */
static void ring_strided(int n, int round)
{
    double *out = malloc(sizeof(double) * 2 * (size_t) n), *in = calloc(2 * (size_t) n, sizeof(double));
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    MPI_Datatype vec;
    if (!out || !in) FAIL("out of memory");
    MPI_Type_vector(n, 1, 2, MPI_DOUBLE, &vec);
    MPI_Type_commit(&vec);
    for (int i = 0; i < 2 * n; i++) out[i] = rank * 1e6 + i + round;
    MPI_Sendrecv(out, 1, vec, to, 100 + round, in, 1, vec, from, 100 + round, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    for (int i = 0; i < 2 * n; i++) {
        double want = (i % 2) ? 0.0 : from * 1e6 + i + round;
        if (in[i] != want) FAIL("strided %d: element %d is %g, expected %g", n, i, in[i], want);
    }
    MPI_Type_free(&vec);
    free(out);
    free(in);
}

/* Every rank sends `k` numbered small messages to every other rank; receivers take them
 * with MPI_ANY_SOURCE and check per-sender order. */
static void flood(int k)
{
    int total = k * (size - 1);
    int *next = calloc((size_t) size, sizeof(int));
    uint64_t *sbuf = malloc(sizeof(uint64_t) * (size_t) total);
    MPI_Request *rq = malloc(sizeof(MPI_Request) * (size_t) total);
    int n = 0;
    if (!next || !sbuf || !rq) FAIL("out of memory");
    for (int j = 0; j < k; j++)
        for (int p = 0; p < size; p++) {
            if (p == rank) continue;
            sbuf[n] = ((uint64_t) rank << 32) | (uint64_t) j;
            MPI_Isend(&sbuf[n], 1, MPI_UINT64_T, p, 7, MPI_COMM_WORLD, &rq[n]);
            n++;
        }
    for (int i = 0; i < total; i++) {
        uint64_t v;
        MPI_Status st;
        MPI_Recv(&v, 1, MPI_UINT64_T, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &st);
        int src = (int) (v >> 32), seq = (int) (v & 0xffffffffu);
        if (src != st.MPI_SOURCE || seq != next[src])
            FAIL("flood: message %d from %d (status source %d), expected %d", seq, src,
                 st.MPI_SOURCE, next[src]);
        next[src]++;
    }
    MPI_Waitall(total, rq, MPI_STATUSES_IGNORE);
    free(next);
    free(sbuf);
    free(rq);
}

static void collectives(void)
{
    const int n = 1 << 16;
    long *a = malloc(sizeof(long) * n), *b = malloc(sizeof(long) * n);
    int *all = malloc(sizeof(int) * (size_t) size * 1024), *mine = malloc(sizeof(int) * (size_t) size * 1024);
    if (!a || !b || !all || !mine) FAIL("out of memory");
    for (int i = 0; i < n; i++) a[i] = rank + i;
    MPI_Allreduce(a, b, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < n; i++)
        if (b[i] != (long) size * (size - 1) / 2 + (long) size * i) FAIL("allreduce element %d", i);
    for (int i = 0; i < n; i++) a[i] = rank == size - 1 ? 3 * i : -1;
    MPI_Bcast(a, n, MPI_LONG, size - 1, MPI_COMM_WORLD);
    for (int i = 0; i < n; i++)
        if (a[i] != 3 * i) FAIL("bcast element %d", i);
    for (int p = 0; p < size; p++)
        for (int i = 0; i < 1024; i++) mine[p * 1024 + i] = rank * 100000 + p * 1024 + i;
    MPI_Alltoall(mine, 1024, MPI_INT, all, 1024, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < size; p++)
        for (int i = 0; i < 1024; i++)
            if (all[p * 1024 + i] != p * 100000 + rank * 1024 + i) FAIL("alltoall from %d", p);
    free(a);
    free(b);
    free(all);
    free(mine);
}

/* One round: a message of `n` bytes to every other rank and one from each, every send
 * and receive posted before any is waited for. The pattern names sender, receiver and
 * round, so a message delivered to the wrong receive or twice does not pass. */
static void all_pairs(unsigned char **out, unsigned char **in, MPI_Request *rq, size_t n,
                      int round)
{
    int k = 0, count;
    MPI_Status *st = malloc(sizeof(MPI_Status) * 2 * (size_t) size);
    if (!st) FAIL("out of memory");
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        memset(in[p], 0xEE, n + 1);
        MPI_Irecv(in[p], (int) n + 1, MPI_BYTE, p, 9, MPI_COMM_WORLD, &rq[k++]);
    }
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        for (size_t i = 0; i < n; i++) out[p][i] = pattern(rank, i, round * size + p);
        MPI_Isend(out[p], (int) n, MPI_BYTE, p, 9, MPI_COMM_WORLD, &rq[k++]);
    }
    MPI_Waitall(k, rq, st);
    k = 0;
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        MPI_Get_count(&st[k++], MPI_BYTE, &count);
        if ((size_t) count != n) FAIL("round %d, size %zu: got count %d from %d", round, n, count, p);
        for (size_t i = 0; i < n; i++)
            if (in[p][i] != pattern(p, i, round * size + rank))
                FAIL("round %d, size %zu from %d: byte %zu differs", round, n, p, i);
        if (in[p][n] != 0xEE) FAIL("round %d, size %zu from %d: wrote past the message", round, n, p);
    }
    free(st);
}

/* Rounds of all_pairs until `seconds` have passed on every rank's clock: after each round
 * the ranks take the minimum of their "time left" flags, so all stop after the same one. */
static void for_duration(double seconds)
{
    static const size_t sizes[] = {1, 1000, 4097, 65537, 262143, 1048577, 4194301};
    const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]), max = 4194301;
    unsigned char **out = calloc((size_t) size, sizeof(*out)), **in = calloc((size_t) size, sizeof(*in));
    MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * (size_t) size);
    int round = 0, go = 1;
    double longest = 0, all_longest = 0, t0, elapsed;
    if (!out || !in || !rq) FAIL("out of memory");
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        out[p] = malloc(max + 1);
        in[p] = malloc(max + 1);
        if (!out[p] || !in[p]) FAIL("out of memory (%zu bytes)", max);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    while (go) {
        double start = MPI_Wtime(), took;
        int more;
        all_pairs(out, in, rq, sizes[(size_t) round % nsizes], round);
        round++;
        more = MPI_Wtime() - t0 < seconds;
        MPI_Allreduce(&more, &go, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        took = MPI_Wtime() - start;
        if (took > longest) longest = took;
    }
    elapsed = MPI_Wtime() - t0;
    MPI_Reduce(&longest, &all_longest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("ringbtl_check: %d rounds in %.1f s, longest %.3f s\n", round, elapsed, all_longest);
    for (int p = 0; p < size; p++) {
        free(out[p]);
        free(in[p]);
    }
    free(out);
    free(in);
    free(rq);
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {0, 1, 7, 8, 100, 1000, 4095, 4096, 4097, 65535, 65536,
                                   65537, 100000, 262144, 1048575, 1048576, 1048577,
                                   4194304 + 3, 16777216};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) FAIL("run with at least 2 ranks");
    if (argc > 2) FAIL("usage: ringbtl_check [SECONDS]");
    if (argc == 2) {
        char *end;
        double seconds = strtod(argv[1], &end);
        if (end == argv[1] || *end != '\0' || !isfinite(seconds) || seconds <= 0)
            FAIL("SECONDS must be a positive number, not \"%s\"", argv[1]);
        for_duration(seconds);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) printf("ringbtl_check: OK (%d ranks)\n", size);
        MPI_Finalize();
        return 0;
    }
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            ring_bytes(sizes[i], round * 100 + (int) i, round);
    ring_strided(10, 0);
    ring_strided(100000, 1);
    ring_strided(600000, 2);
    flood(2000);
    collectives();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("ringbtl_check: OK (%d ranks)\n", size);
    MPI_Finalize();
    return 0;
}
