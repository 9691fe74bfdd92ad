/*
 * A rank that dies in the middle of an exchange: every rank exchanges messages of several
 * sizes (small, eager, rendezvous, 1 MiB and non-powers of two) with every other rank, over
 * and over (Irecv + Isend to all, Waitall). Rank VICTIM, in iteration ITER, posts its
 * receives and sends, progresses them once and kills itself with SIGKILL, so that the
 * others are inside MPI, talking to it, when it dies.
 *
 * Usage: ringbtl_die VICTIM ITER [SECONDS]
 *
 * The victim prints, just before it dies, one line with the wall-clock time (CLOCK_REALTIME,
 * the same clock in every network namespace of the machine):
 *   ringbtl_die: rank VICTIM killed itself in iteration ITER at UNIX_SECONDS
 * The job is then expected to end with an error naming that rank. A rank still exchanging
 * SECONDS (default 120) after the start prints "ringbtl_die: rank R still running" and
 * exits 3; every byte received is checked, a mismatch exits 2. Success is no outcome here:
 * a job that ends with status 0 has missed the death.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const int sizes[] = {8, 4099, 65536, 131101, 1048576, 1000003};
#define NSIZES ((int) (sizeof(sizes) / sizeof(sizes[0])))

static unsigned char pattern(int src, int dst, int s, int iter, size_t i)
{
    return (unsigned char) (src * 37 + dst * 11 + s * 5 + iter * 3 + (int) (i * 13) + (int) (i >> 10));
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 3 || size < 2) {
        if (0 == rank) fprintf(stderr, "usage: ringbtl_die VICTIM ITER [SECONDS] (2 ranks or more)\n");
        MPI_Finalize();
        return 1;
    }
    const int victim = atoi(argv[1]), kill_at = atoi(argv[2]);
    const double limit = argc > 3 ? atof(argv[3]) : 120.0;
    if (victim < 0 || victim >= size || kill_at < 0) {
        if (0 == rank) fprintf(stderr, "ringbtl_die: victim %d of %d ranks, iteration %d\n", victim, size, kill_at);
        MPI_Finalize();
        return 1;
    }

    const int npeers = size - 1;
    const int nreq = 2 * npeers * NSIZES;
    unsigned char **out = calloc((size_t) npeers * NSIZES, sizeof(*out));
    unsigned char **in = calloc((size_t) npeers * NSIZES, sizeof(*in));
    MPI_Request *rq = calloc((size_t) nreq, sizeof(*rq));
    if (!out || !in || !rq) {
        fprintf(stderr, "ringbtl_die rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int k = 0; k < npeers * NSIZES; k++) {
        out[k] = malloc((size_t) sizes[k % NSIZES]);
        in[k] = malloc((size_t) sizes[k % NSIZES]);
        if (!out[k] || !in[k]) {
            fprintf(stderr, "ringbtl_die rank %d: out of memory\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    const double start = MPI_Wtime();
    for (int iter = 0;; iter++) {
        int r = 0;
        for (int j = 0; j < npeers; j++) {
            const int peer = j < rank ? j : j + 1;
            for (int s = 0; s < NSIZES; s++) {
                MPI_Irecv(in[j * NSIZES + s], sizes[s], MPI_BYTE, peer, s, MPI_COMM_WORLD, &rq[r++]);
            }
        }
        for (int j = 0; j < npeers; j++) {
            const int peer = j < rank ? j : j + 1;
            for (int s = 0; s < NSIZES; s++) {
                unsigned char *b = out[j * NSIZES + s];
                for (size_t i = 0; i < (size_t) sizes[s]; i++) b[i] = pattern(rank, peer, s, iter, i);
                MPI_Isend(b, sizes[s], MPI_BYTE, peer, s, MPI_COMM_WORLD, &rq[r++]);
            }
        }
        if (rank == victim && iter == kill_at) {
            /* Some of this iteration's bytes are on their way when it dies. */
            int done;
            MPI_Testall(nreq, rq, &done, MPI_STATUSES_IGNORE);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            printf("ringbtl_die: rank %d killed itself in iteration %d at %lld.%09ld\n", rank, iter,
                   (long long) ts.tv_sec, ts.tv_nsec);
            fflush(stdout);
            raise(SIGKILL);
        }
        MPI_Waitall(nreq, rq, MPI_STATUSES_IGNORE);
        for (int j = 0; j < npeers; j++) {
            const int peer = j < rank ? j : j + 1;
            for (int s = 0; s < NSIZES; s++) {
                const unsigned char *b = in[j * NSIZES + s];
                for (size_t i = 0; i < (size_t) sizes[s]; i++) {
                    if (b[i] != pattern(peer, rank, s, iter, i)) {
                        fprintf(stderr, "ringbtl_die rank %d: iteration %d, %d bytes from %d: byte %zu differs\n",
                                rank, iter, sizes[s], peer, i);
                        exit(2);
                    }
                }
            }
        }
        if (MPI_Wtime() - start > limit) {
            fprintf(stderr, "ringbtl_die: rank %d still running after %.0f s (iteration %d)\n", rank, limit, iter);
            exit(3);
        }
    }
}
