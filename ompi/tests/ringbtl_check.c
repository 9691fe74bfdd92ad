/*
 * Correctness check of a BTL under MPI: point-to-point at sizes around ob1's protocol
 * switch points (eager, rendezvous, pipelined), contiguous and strided datatypes,
 * synchronous sends, a flood of small messages from every rank (per-peer order,
 * MPI_ANY_SOURCE), and collectives. Every received byte is checked.
 * Exit status 0 and "ringbtl_check: OK" on success; the first mismatch aborts the job.
 */
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

int main(int argc, char **argv)
{
    static const size_t sizes[] = {0, 1, 7, 8, 100, 1000, 4095, 4096, 4097, 65535, 65536,
                                   65537, 100000, 262144, 1048575, 1048576, 1048577,
                                   4194304 + 3, 16777216};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) FAIL("run with at least 2 ranks");
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
