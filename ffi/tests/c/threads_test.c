/*
 * The C ABI entered from several threads, one call at a time, as an MPI library under
 * MPI_THREAD_MULTIPLE enters it: two transports in one process on loopback, made by the
 * main thread with ringbtl_config_threads(cfg, 1); THREADS threads, none of which made
 * them, each send checked messages from A to B and progress both, every call under the
 * lock of its transport. Sizes 8, 1,000, 70,000 and 300,003 bytes (copied, large, long
 * enough to lend); B checks every byte and the order of each thread's messages; every
 * send completes exactly once with success, and its buffer is freed in its completion.
 * A second round runs after the threads of the first are gone, from new threads.
 *
 * Built with -Wall -Wextra -Werror -std=c11 -pthread against ffi/include/ringbtl.h (also
 * with -fsanitize=thread where the compiler can) and run by ffi/tests/c_program.rs on
 * every backend; exits 0 and prints "threads_test: OK (<backend>)" when every check
 * passed. Loops are bounded in time.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "ringbtl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    THREADS = 4,
    PER_THREAD = 120, /* messages per thread and round */
    ROUNDS = 2,
    TAG = 7,
    NSIZES = 4
};

static const size_t sizes[NSIZES] = {8, 1000, 70000, 300003};

static ringbtl_t *A, *B;
static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;

/* Under lock_b (B's callbacks run inside ringbtl_progress(B)). */
static unsigned received[THREADS];   /* next sequence number expected from each thread */
static unsigned bad;
/* Under lock_a. */
static unsigned completed, failed;

/* Byte j of message `seq` of thread `t`; bytes 0-1 carry t and seq. */
static unsigned char pattern(unsigned t, unsigned seq, size_t j) {
    return (unsigned char) (t * 131u + seq * 7u + (unsigned) (j % 251u));
}

static size_t msg_len(unsigned seq) {
    return sizes[seq % NSIZES];
}

static void b_on_data(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void) ctx;
    const unsigned char *p = data;
    if (src != 0 || tag != TAG || len < 8) {
        bad++;
        return;
    }
    unsigned t = p[0], seq = (unsigned) p[1] | (unsigned) p[2] << 8;
    if (t >= THREADS || seq != received[t] || len != msg_len(seq)) {
        fprintf(stderr, "thread %u message %u (%zu bytes) out of order (expected %u)\n", t,
                seq, len, t < THREADS ? received[t] : 0);
        bad++;
        return;
    }
    for (size_t j = 8; j < len; j++) {
        if (p[j] != pattern(t, seq, j)) {
            fprintf(stderr, "thread %u message %u: byte %zu differs\n", t, seq, j);
            bad++;
            return;
        }
    }
    received[t]++;
}

static void a_on_complete(void *ctx, uint32_t peer, uint64_t cookie, int status) {
    (void) ctx;
    (void) peer;
    free((void *) (uintptr_t) cookie);
    if (status == RINGBTL_OK) {
        completed++;
    } else {
        failed++;
    }
}

static void progress_both(void) {
    pthread_mutex_lock(&lock_a);
    int ra = ringbtl_progress(A);
    pthread_mutex_unlock(&lock_a);
    pthread_mutex_lock(&lock_b);
    int rb = ringbtl_progress(B);
    pthread_mutex_unlock(&lock_b);
    CHECK(ra >= 0 && rb >= 0, "progress: %d, %d", ra, rb);
}

struct job {
    unsigned t, first;
};

static void *worker(void *arg) {
    const struct job *j = arg;
    double deadline = now_s() + 30.0;
    for (unsigned k = 0; k < PER_THREAD; k++) {
        unsigned seq = j->first + k;
        size_t len = msg_len(seq);
        unsigned char *buf = malloc(len);
        CHECK(buf != NULL, "malloc");
        buf[0] = (unsigned char) j->t;
        buf[1] = (unsigned char) (seq & 0xff);
        buf[2] = (unsigned char) (seq >> 8);
        for (size_t i = 3; i < 8; i++) buf[i] = 0;
        for (size_t i = 8; i < len; i++) buf[i] = pattern(j->t, seq, i);
        ringbtl_iov_t iov = {buf, len};
        for (;;) {
            pthread_mutex_lock(&lock_a);
            int rc = ringbtl_send(A, 1, TAG, &iov, 1, (uint64_t) (uintptr_t) buf);
            pthread_mutex_unlock(&lock_a);
            if (rc == RINGBTL_OK) break;
            CHECK(rc == RINGBTL_ERR_WOULD_BLOCK, "send: %d", rc);
            CHECK(now_s() < deadline, "thread %u: sends blocked for 30 s", j->t);
            progress_both();
        }
        progress_both();
    }
    return NULL;
}

static int done(unsigned per_thread) {
    pthread_mutex_lock(&lock_a);
    unsigned c = completed + failed;
    pthread_mutex_unlock(&lock_a);
    pthread_mutex_lock(&lock_b);
    unsigned r = 0;
    for (unsigned t = 0; t < THREADS; t++) r += received[t] == per_thread;
    unsigned b = bad;
    pthread_mutex_unlock(&lock_b);
    CHECK(b == 0, "B saw %u bad messages", b);
    return c == THREADS * per_thread && r == THREADS;
}

static ringbtl_t *make(uint32_t id) {
    ringbtl_config_t *cfg = NULL;
    CHECK(ringbtl_config_new(id, &cfg) == RINGBTL_OK && cfg != NULL, "config_new");
    /* RINGBTL_BACKEND from the environment picks the backend under test */
    CHECK(ringbtl_config_from_env(cfg) == RINGBTL_OK, "config_from_env");
    CHECK(ringbtl_config_threads(cfg, 1) == RINGBTL_OK, "config_threads");
    ringbtl_t *t = NULL;
    CHECK(ringbtl_create(cfg, &t) == RINGBTL_OK && t != NULL, "create %u", id);
    return t;
}

int main(void) {
    CHECK(ringbtl_config_threads(NULL, 1) == RINGBTL_ERR_INVALID, "NULL config");
    A = make(0);
    B = make(1);
    CHECK(strcmp(ringbtl_backend_name(A), ringbtl_backend_name(B)) == 0, "same backend");
    CHECK(ringbtl_add_peer(A, 1, ringbtl_uris(B)) == RINGBTL_OK, "add B");
    CHECK(ringbtl_add_peer(B, 0, ringbtl_uris(A)) == RINGBTL_OK, "add A");
    ringbtl_on_complete(A, a_on_complete, NULL);
    CHECK(ringbtl_register(B, TAG, b_on_data, NULL) == RINGBTL_OK, "register");
    for (unsigned round = 0; round < ROUNDS; round++) {
        pthread_t th[THREADS];
        struct job jobs[THREADS];
        for (unsigned t = 0; t < THREADS; t++) {
            jobs[t] = (struct job){t, round * PER_THREAD};
            CHECK(pthread_create(&th[t], NULL, worker, &jobs[t]) == 0, "pthread_create");
        }
        for (unsigned t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
        /* The main thread finishes what the workers left in flight. */
        double deadline = now_s() + 30.0;
        while (!done((round + 1) * PER_THREAD)) {
            CHECK(now_s() < deadline, "round %u: not every message arrived and completed "
                                      "within 30 s (completed %u, failed %u)",
                  round, completed, failed);
            progress_both();
        }
        CHECK(failed == 0, "%u sends failed", failed);
        printf("ok: round %u: %u threads x %u messages, every byte checked, each send "
               "completed once\n",
               round, THREADS, PER_THREAD);
    }
    printf("threads_test: OK (%s)\n", ringbtl_backend_name(A));
    ringbtl_destroy(A, 2000);
    ringbtl_destroy(B, 2000);
    return 0;
}
