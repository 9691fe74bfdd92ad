/*
 * The progress thread (btl_ringbtl_progress_thread 1); docs/design/progress.md.
 *
 * While a program computes outside MPI, nobody calls opal_progress: ob1's protocols stand
 * still (a rendezvous needs a call at each step: RNDV, the receiver's put request, the
 * puts, FIN), although the kernel could move their bytes meanwhile. The program's
 * progress calls count themselves (one relaxed store; no clock is read on the program's
 * path). The thread sleeps btl_ringbtl_progress_thread_us, and twice as long each time
 * it finds the program inside MPI (at most RINGBTL_THREAD_BACKOFF times: each wake takes
 * the core from a rank that spins in MPI). On a wake, the program is away when it made no
 * call since the last look, or none during a further RINGBTL_THREAD_PROBE_NS; otherwise
 * it progresses by itself and the thread sleeps again, having touched no lock. While the
 * program is away, until it calls again, the thread waits for the transports'
 * descriptors (ringbtl_wait_fd) and progresses them whenever they have work, each under
 * its module's lock taken with trylock (a program thread that holds it goes first). ob1
 * is then entered from two threads; as btl tcp does for its own progress thread, the
 * component tells Open MPI so (opal_using_threads), and its modules serialise their
 * entry points.
 */
#include "btl_ringbtl.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

volatile unsigned long mca_btl_ringbtl_progress_calls;

static pthread_t progress_thread;
static int progress_running; /* read and written with __atomic builtins */
static bool progress_started;
/* Wakes of the thread from its sleeps and probes, those that found the program away, and
 * those that moved something (btl_ringbtl_verbose). Written by the thread only, read
 * after it was joined. */
static unsigned long wakes, away_count, moved_wakes;
/* The longest sleep the thread took (ns; btl_ringbtl_verbose). */
static long longest_sleep;

/* Passes in a row the thread makes while they move something, before it sleeps again. */
#define RINGBTL_THREAD_PASSES 64
/* Longest wait in poll(2) while the program is away (the transports' timers). */
#define RINGBTL_THREAD_WAIT_MS 1
/* The program is away from MPI when it has not called progress for this long. */
#define RINGBTL_THREAD_PROBE_NS 100000L
/* The longest sleep while the program stays inside MPI, in sleeps of
 * btl_ringbtl_progress_thread_us; the first after the program was away is one. */
#define RINGBTL_THREAD_BACKOFF 16
/* One descriptor per module, whether the modules are interfaces' or shards. */
#define RINGBTL_THREAD_MAX_FDS \
    (RINGBTL_MAX_IF_MODULES > RINGBTL_MAX_SHARDS ? RINGBTL_MAX_IF_MODULES : RINGBTL_MAX_SHARDS)

static unsigned long progress_calls(void)
{
    return __atomic_load_n(&mca_btl_ringbtl_progress_calls, __ATOMIC_RELAXED);
}

/* One round of the thread while the program is away: passes over every module while they
 * move something (at most RINGBTL_THREAD_PASSES); whether any did. */
static bool drive(mca_btl_ringbtl_component_t *c, unsigned long seen)
{
    bool moved = false;
    for (int pass = 0; pass < RINGBTL_THREAD_PASSES; pass++) {
        int n = 0;
        for (unsigned i = 0; i < c->nmodules; i++) {
            mca_btl_ringbtl_module_t *m = c->modules[i];
            /* The job key is read by the program's first progress after the modex
             * (mca_btl_ringbtl_ensure_key), never earlier: not from here. */
            if (NULL != m && !__atomic_load_n(&m->key_pending, __ATOMIC_ACQUIRE)) {
                n += mca_btl_ringbtl_progress_module(m);
            }
        }
        moved |= n > 0;
        if (0 == n || progress_calls() != seen
            || !__atomic_load_n(&progress_running, __ATOMIC_ACQUIRE)) {
            break;
        }
    }
    return moved;
}

static void sleep_ns(long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    (void) nanosleep(&ts, NULL);
}

/* While the program is away: readies each transport for a wait (ringbtl_wait_fd, under
 * its module's lock), waits in poll(2) for their descriptors (at most
 * RINGBTL_THREAD_WAIT_MS, for the transports' own timers) unless one has something
 * already, and progresses them, until the program calls the component's progress again. */
static void away(mca_btl_ringbtl_component_t *c, unsigned long seen, long period_ns)
{
    while (__atomic_load_n(&progress_running, __ATOMIC_ACQUIRE) && progress_calls() == seen) {
        struct pollfd fds[RINGBTL_THREAD_MAX_FDS];
        nfds_t nfds = 0;
        bool now = false;
        for (unsigned i = 0; i < c->nmodules && nfds < RINGBTL_THREAD_MAX_FDS; i++) {
            mca_btl_ringbtl_module_t *m = c->modules[i];
            if (NULL == m || NULL == m->rt || m->closing
                || __atomic_load_n(&m->key_pending, __ATOMIC_ACQUIRE)) {
                continue;
            }
            if (0 != pthread_mutex_trylock(&m->lock)) {
                /* A program thread is in: it progresses. */
                return;
            }
            int fd = -1;
            const int rc = ringbtl_wait_fd(m->rt, &fd);
            pthread_mutex_unlock(&m->lock);
            if (RINGBTL_OK != rc || fd < 0) {
                now = true;
            } else {
                fds[nfds].fd = fd;
                fds[nfds].events = POLLIN;
                nfds++;
            }
        }
        if (!now) {
            (void) poll(fds, nfds, RINGBTL_THREAD_WAIT_MS);
        }
        if (progress_calls() != seen) {
            return;
        }
        if (drive(c, seen)) {
            moved_wakes++;
        } else if (now) {
            /* Work the transport had, and left for later (a held link): no busy loop. */
            sleep_ns(period_ns / 10);
        }
    }
}

static void *progress_main(void *arg)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    const long period_ns = (long) c->progress_thread_us * 1000L;
    long sleep_for = period_ns;
    unsigned long looked = progress_calls();

    (void) arg;
    /* The default timer slack (50 us) would stretch short sleeps. */
    (void) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    while (__atomic_load_n(&progress_running, __ATOMIC_ACQUIRE)) {
        sleep_ns(sleep_for);
        wakes++;
        if (sleep_for > longest_sleep) {
            longest_sleep = sleep_for;
        }
        unsigned long seen = progress_calls();
        if (seen != looked) {
            /* It called during the sleep: is it still calling? */
            sleep_ns(RINGBTL_THREAD_PROBE_NS);
            wakes++;
            looked = progress_calls();
            if (looked != seen) {
                /* The program is in MPI: it progresses by itself. */
                if (sleep_for < period_ns * RINGBTL_THREAD_BACKOFF) {
                    sleep_for *= 2;
                }
                continue;
            }
        }
        away_count++;
        away(c, seen, period_ns);
        looked = progress_calls();
        /* A program that computed once computes again soon (an iteration's next step). */
        sleep_for = period_ns;
    }
    return NULL;
}

bool mca_btl_ringbtl_progress_thread_start(void)
{
    if (progress_started) {
        return true;
    }
    /* ob1 (and the rest of Open MPI) is entered from the thread too: said before it runs.
     * Were it not started, Open MPI would only lock more than it needs. */
    ringbtl_compat_set_using_threads();
    __atomic_store_n(&progress_running, 1, __ATOMIC_RELEASE);
    const int rc = pthread_create(&progress_thread, NULL, progress_main, NULL);
    if (0 != rc) {
        __atomic_store_n(&progress_running, 0, __ATOMIC_RELEASE);
        opal_output(0, "btl ringbtl: no progress thread: pthread_create: %s", strerror(rc));
        return false;
    }
    progress_started = true;
    return true;
}

void mca_btl_ringbtl_progress_thread_stop(void)
{
    if (!progress_started) {
        return;
    }
    __atomic_store_n(&progress_running, 0, __ATOMIC_RELEASE);
    (void) pthread_join(progress_thread, NULL);
    progress_started = false;
    if (mca_btl_ringbtl_component.verbose > 0) {
        opal_output(0, "btl ringbtl: progress thread: %lu wakes, longest sleep %ld us, %lu "
                       "with the program away, %lu of them moved something",
                    wakes, longest_sleep / 1000L, away_count, moved_wakes);
    }
}
