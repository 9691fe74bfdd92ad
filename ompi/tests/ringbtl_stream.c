/*
 * A checked stream from rank 0 to rank 1: TOTAL MiB in messages of SIZE bytes, WINDOW of
 * them in flight (MPI_Isend / MPI_Irecv into a buffer each), one 4-byte acknowledgement per
 * window (osu_bw's shape). Every received byte is checked: 64-bit word j of message k is
 * a function of k and j, so a message's bytes out of place, or another message's, differ.
 * Rank 0 prints the rate over the whole stream (MB = 10^6 bytes), after one untimed window.
 *
 * Usage: ringbtl_stream [SIZE [TOTAL_MIB [WINDOW]]]   (default 4194304 64 8; SIZE a multiple
 *        of 8, at least 8)
 * Exit status 0 and "ringbtl_stream: OK" on success; a mismatch aborts the job.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t word(uint64_t k, uint64_t j)
{
    return (k << 40) ^ (j * 0x9E3779B97F4A7C15ull) ^ 0x5bd1e995u;
}

static void fill(uint64_t *b, size_t words, uint64_t k)
{
    for (size_t j = 0; j < words; j++) {
        b[j] = word(k, j);
    }
}

static void check(const uint64_t *b, size_t words, uint64_t k)
{
    for (size_t j = 0; j < words; j++) {
        if (b[j] != word(k, j)) {
            fprintf(stderr,
                    "ringbtl_stream: message %llu, byte %zu: got %016llx, expected %016llx\n",
                    (unsigned long long) k, j * 8, (unsigned long long) b[j],
                    (unsigned long long) word(k, j));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long msg = argc > 1 ? atol(argv[1]) : 4194304;
    const long mib = argc > 2 ? atol(argv[2]) : 64;
    const long window = argc > 3 ? atol(argv[3]) : 8;
    if (size < 2 || msg < 8 || msg % 8 != 0 || msg > (1L << 30) || mib < 1 || window < 1
        || window > 1024) {
        if (0 == rank) {
            fprintf(stderr, "usage: ringbtl_stream [SIZE [TOTAL_MIB [WINDOW]]] at 2 ranks or "
                            "more (SIZE a multiple of 8, 8 B to 1 GiB; WINDOW 1 to 1024)\n");
        }
        MPI_Finalize();
        return 2;
    }
    const size_t words = (size_t) msg / 8;
    long count = (mib << 20) / msg;
    if (count < window) {
        count = window;
    }
    uint64_t **buf = calloc((size_t) window, sizeof(*buf));
    MPI_Request *req = calloc((size_t) window, sizeof(*req));
    if (NULL == buf || NULL == req) {
        fprintf(stderr, "ringbtl_stream: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long w = 0; w < window; w++) {
        buf[w] = malloc((size_t) msg);
        if (NULL == buf[w]) {
            fprintf(stderr, "ringbtl_stream: out of memory\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    int ack = 0;
    double t0 = 0;
    /* One untimed window first (connections, registrations), then the stream. */
    for (long k = -window; k < count && rank < 2; k += window) {
        if (0 == k) {
            t0 = MPI_Wtime();
        }
        const long n = (k + window <= count) ? window : count - k;
        for (long w = 0; w < n; w++) {
            const uint64_t id = (uint64_t) (k + window + w);
            if (0 == rank) {
                fill(buf[w], words, id);
                MPI_Isend(buf[w], (int) msg, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &req[w]);
            } else {
                MPI_Irecv(buf[w], (int) msg, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &req[w]);
            }
        }
        MPI_Waitall((int) n, req, MPI_STATUSES_IGNORE);
        if (0 == rank) {
            MPI_Recv(&ack, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (long w = 0; w < n; w++) {
                check(buf[w], words, (uint64_t) (k + window + w));
            }
            MPI_Send(&ack, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
        }
    }
    const double secs = MPI_Wtime() - t0;
    if (0 == rank) {
        printf("ringbtl_stream: %ld messages of %ld bytes (%.1f MiB) in %.3f s, %.1f MB/s\n",
               count, msg, (double) count * (double) msg / (1 << 20), secs,
               (double) count * (double) msg / 1e6 / secs);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) {
        printf("ringbtl_stream: OK (%d ranks)\n", size);
    }
    for (long w = 0; w < window; w++) {
        free(buf[w]);
    }
    free(buf);
    free(req);
    MPI_Finalize();
    return 0;
}
