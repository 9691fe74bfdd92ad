/*
 * The C ABI from C: two transports in one process on loopback.
 *
 * - gather sends of 1 to 8 segments with cookies, small (copied) and large (sent from
 *   this program's memory, which is poisoned and freed in the completion callback); every
 *   byte checked at the receiver, in order; every completion exactly once;
 * - sends from inside a receive callback and from inside a completion callback, nested
 *   progress and wait returning 0, a callback that unregisters itself, re-registration;
 * - error codes and messages for bad input;
 * - a job key drawn by the library, set on live transports (and in the configuration of
 *   the later ones): every connection below is authenticated with it;
 * - puts into a region B registered, in one and in several segments: every byte in place
 *   when the message sent after them arrives; bad region arguments; deregistration;
 * - lazy add: a process A was never told about connects; A's resolver adds it and
 *   accepts, and its messages arrive; a declining resolver refuses another;
 * - a peer destroyed while sends to it are in flight: every send still completes once;
 * - links: two transports with RINGBTL_LINKS=2 hold two connections to each other (one
 *   without links where the multishot receive is on), messages arrive in order, the
 *   counters say so;
 * - destroy.
 *
 * Built with -Wall -Wextra -Werror -std=c11 against ffi/include/ringbtl.h and run by
 * ffi/tests/c_program.rs; exits 0 when every check passed. Loops are bounded in time.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "ringbtl.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ringbtl_iov_t as the library lays it out (RingbtlIov in ffi/src/handle.rs) */
_Static_assert(sizeof(ringbtl_iov_t) == 2 * sizeof(size_t), "ringbtl_iov_t size");
_Static_assert(offsetof(ringbtl_iov_t, len) == sizeof(void *), "ringbtl_iov_t.len offset");

enum {
    NMSG = 300,          /* data messages A -> B */
    NFAIL = 160,         /* sent when B goes away: more than the socket buffers hold */
    TAG_DATA = 7,
    TAG_REPLY = 8,
    TAG_LATE = 9,        /* sent from inside a completion callback */
    TAG_ONCE = 10,       /* its callback unregisters itself */
    TAG_LAZY = 11,       /* from processes A was never told about */
    TAG_PUT_DONE = 12,   /* sent after the puts: they are in place */
    REGION_LEN = 256 * 1024,
    NLAZY = 10,
    MAX_FRAME = 64 * 1024,
    COOKIE_REPLY = 100000,
    COOKIE_LATE = 200000,
    COOKIE_ONCE = 300000,
    COOKIE_FAIL = 400000,
    COOKIE_MAX = 400000 + NFAIL
};

static ringbtl_t *A, *B;

/* Sender A */
static unsigned char *bufs[NMSG];
static unsigned a_completed[COOKIE_MAX];
static int a_status[COOKIE_MAX];
static unsigned a_replies, a_errors, a_nested_zero;
static unsigned char fail_buf[NFAIL][MAX_FRAME - 4096];
/* Receiver B */
static unsigned char reply_buf[NMSG][4];
static unsigned b_received, b_late, b_once, b_completed, b_nested_zero;

static size_t msg_len(unsigned i) {
    /* small ones are copied next to their header, large ones sent by reference */
    return (i % 3 == 0) ? 4 + i % 200 : 2000 + (i * 397) % (MAX_FRAME - 2000);
}

static unsigned char pattern(unsigned i, size_t j) {
    return (unsigned char)(i * 31u + j * 7u + (j >> 8));
}

static void put_index(unsigned char *p, unsigned i) {
    p[0] = (unsigned char)(i >> 24);
    p[1] = (unsigned char)(i >> 16);
    p[2] = (unsigned char)(i >> 8);
    p[3] = (unsigned char)i;
}

static unsigned get_index(const unsigned char *p) {
    return ((unsigned)p[0] << 24) | ((unsigned)p[1] << 16) | ((unsigned)p[2] << 8) | p[3];
}

/* Sends `len` bytes of `buf` as `nseg` segments cut at fixed points. */
static int send_split(ringbtl_t *t, uint32_t peer, uint8_t tag, const unsigned char *buf,
                      size_t len, size_t nseg, uint64_t cookie) {
    ringbtl_iov_t iov[8];
    size_t at = 0;
    for (size_t s = 0; s < nseg; s++) {
        size_t end = (s + 1 == nseg) ? len : len * (s + 1) / nseg;
        iov[s].base = buf + at;
        iov[s].len = end - at;
        at = end;
    }
    return ringbtl_send(t, peer, tag, iov, nseg, cookie);
}

/* ----- B's callbacks ---------------------------------------------------------------- */

static void b_on_data(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    CHECK(ctx == &b_received, "context passed through");
    CHECK(src == 0 && tag == TAG_DATA, "src %u tag %u", src, tag);
    const unsigned char *p = data;
    CHECK(len >= 4, "message of %zu bytes", len);
    unsigned i = get_index(p);
    CHECK(i == b_received, "message %u arrived as number %u (order)", i, b_received);
    CHECK(len == msg_len(i), "message %u: %zu bytes, want %zu", i, len, msg_len(i));
    for (size_t j = 4; j < len; j++) {
        CHECK(p[j] == pattern(i, j), "message %u byte %zu", i, j);
    }
    b_received++;
    /* nested progress does nothing */
    CHECK(ringbtl_progress(B) == 0, "nested progress");
    CHECK(ringbtl_wait(B, 1000) == 0, "nested wait");
    b_nested_zero++;
    /* reply from inside the callback with this message's index: from memory that stays
     * valid until the completion (not from `data`, valid only during this call) */
    memcpy(reply_buf[i], p, 4);
    ringbtl_iov_t iov = {reply_buf[i], 4};
    CHECK(ringbtl_send(B, src, TAG_REPLY, &iov, 1, COOKIE_REPLY + i) == RINGBTL_OK,
          "reply from a callback");
}

static void b_on_late(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void)ctx;
    CHECK(src == 0 && tag == TAG_LATE && len == 5 && memcmp(data, "late!", 5) == 0, "late");
    b_late++;
    CHECK(ringbtl_destroy(B, 0) == RINGBTL_ERR_INVALID, "destroy inside a callback");
}

static void b_on_once(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void)ctx;
    (void)src;
    (void)data;
    (void)len;
    CHECK(tag == TAG_ONCE, "tag");
    b_once++;
    CHECK(ringbtl_unregister(B, TAG_ONCE) == RINGBTL_OK, "unregister inside own callback");
    CHECK(ringbtl_unregister(B, TAG_ONCE) == RINGBTL_ERR_INVALID, "twice");
}

static void b_on_complete(void *ctx, uint32_t peer, uint64_t cookie, int status) {
    (void)ctx;
    CHECK(peer == 0 && status == RINGBTL_OK, "B's completion %llu: %d",
          (unsigned long long)cookie, status);
    CHECK(cookie >= COOKIE_REPLY && cookie < COOKIE_REPLY + NMSG, "cookie");
    b_completed++;
}

/* ----- A's callbacks ---------------------------------------------------------------- */

static void a_on_reply(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void)ctx;
    CHECK(src == 1 && tag == TAG_REPLY && len == 4, "reply");
    CHECK(get_index(data) == a_replies, "reply %u in order", a_replies);
    a_replies++;
}

static void a_on_complete(void *ctx, uint32_t peer, uint64_t cookie, int status) {
    CHECK(ctx == a_completed, "context passed through");
    CHECK(peer == 1, "peer %u", peer);
    CHECK(cookie < COOKIE_MAX, "cookie %llu", (unsigned long long)cookie);
    a_completed[cookie]++;
    a_status[cookie] = status;
    CHECK(a_completed[cookie] == 1, "cookie %llu completed twice", (unsigned long long)cookie);
    if (cookie < NMSG) {
        CHECK(status == RINGBTL_OK, "send %llu: %s", (unsigned long long)cookie,
              ringbtl_strerror(status));
        /* The library is done with the bytes: poison and free them. */
        memset(bufs[cookie], 0xEE, msg_len((unsigned)cookie));
        free(bufs[cookie]);
        bufs[cookie] = NULL;
        if (cookie == 0) {
            static const char late[] = "late!";
            ringbtl_iov_t iov = {late, 5};
            CHECK(ringbtl_send(A, 1, TAG_LATE, &iov, 1, COOKIE_LATE) == RINGBTL_OK,
                  "send from a completion callback");
            CHECK(ringbtl_progress(A) == 0, "nested progress in a completion callback");
            size_t pending = ringbtl_pending(A, 1);
            CHECK(pending >= 1 && pending <= NMSG + 1, "pending in a callback: %zu", pending);
            a_nested_zero++;
        }
    }
}

static void a_on_error(void *ctx, uint32_t peer, int status, const char *msg) {
    (void)ctx;
    CHECK(peer == 1 && status < 0 && msg != NULL && msg[0] != '\0', "error callback");
    fprintf(stderr, "peer %u failed: %s (%s)\n", peer, msg, ringbtl_strerror(status));
    a_errors++;
}

/* ----- lazy add: processes 2 (accepted) and 3 (declined), unknown to A --------------- */

static ringbtl_t *LZ[2];
static unsigned lazy_asked[2], lazy_got, lazy_done[2], lazy_failed;
static int lazy_status[2];

static int a_resolve(void *ctx, uint32_t peer) {
    CHECK(ctx == lazy_asked, "context passed through");
    CHECK(peer == 2 || peer == 3, "asked about %u", peer);
    lazy_asked[peer - 2]++;
    CHECK(ringbtl_progress(A) == 0, "nested progress in a resolver");
    if (peer == 3) {
        return 0;
    }
    CHECK(ringbtl_add_peer(A, peer, ringbtl_uris(LZ[0])) == RINGBTL_OK, "add in a resolver");
    return 1;
}

static void a_on_lazy(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void)ctx;
    CHECK(src == 2 && tag == TAG_LAZY && len == 4, "lazy message from %u", src);
    CHECK(get_index(data) == lazy_got, "lazy message %u in order", lazy_got);
    lazy_got++;
}

static void lz_on_complete(void *ctx, uint32_t peer, uint64_t cookie, int status) {
    unsigned *i = ctx;
    CHECK(peer == 0 && cookie < NLAZY, "completion of %u", peer);
    lazy_done[*i]++;
    lazy_status[*i] = status;
}

static void lz_on_error(void *ctx, uint32_t peer, int status, const char *msg) {
    (void)ctx;
    CHECK(peer == 0 && status == RINGBTL_ERR_PROTOCOL, "refused: %d %s", status, msg);
    CHECK(strstr(msg, "UnknownPeer") != NULL, "says why: %s", msg);
    lazy_failed++;
}

static int lazy_done_all(void) {
    return lazy_got == NLAZY && lazy_done[0] == NLAZY && lazy_done[1] == 1 && lazy_failed == 1;
}

/* Progress both until `done()` holds; at most 20 s. */
static void drive(int (*done)(void), const char *what, int with_b) {
    double deadline = now_s() + 20.0;
    while (!done()) {
        CHECK(now_s() < deadline, "%s: stalled", what);
        CHECK(ringbtl_progress(A) >= 0, "progress A");
        if (with_b) {
            CHECK(ringbtl_progress(B) >= 0, "progress B");
        }
    }
}

static int get_done(void) {
    return a_completed[COOKIE_ONCE + 20] == 1;
}

static int all_data_done(void) {
    unsigned done = 0;
    for (unsigned i = 0; i < NMSG; i++) {
        done += a_completed[i];
    }
    return done == NMSG && b_received == NMSG && a_replies == NMSG && b_completed == NMSG &&
           a_completed[COOKIE_LATE] == 1 && b_late == 1;
}

static int marker_done(void) {
    return b_late == 2 && a_completed[COOKIE_ONCE + 2] == 1;
}

static int reregistered_done(void) {
    return b_once == 2;
}

static unsigned char *region;  /* B's registered region */
static unsigned put_checked;

/* Byte `j` of the region after the puts of section 2d. */
static unsigned char region_want(size_t j) {
    if (j >= 10 && j < 110) {
        return (unsigned char)(j * 3 + 1);
    }
    if (j >= 1000 && j < 61000) {
        return (unsigned char)(j / 7 + j);
    }
    return 0;
}

static void b_on_put_done(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void)ctx;
    (void)data;
    CHECK(src == 0 && tag == TAG_PUT_DONE && len == 1, "put marker");
    for (size_t j = 0; j < REGION_LEN; j++) {
        CHECK(region[j] == region_want(j), "region byte %zu: %u, want %u", j, region[j],
              region_want(j));
    }
    put_checked++;
}

static int put_done(void) {
    return put_checked == 1 && a_completed[COOKIE_ONCE + 10] == 1 &&
           a_completed[COOKIE_ONCE + 11] == 1 && a_completed[COOKIE_ONCE + 12] == 1;
}

static int fail_done(void) {
    for (unsigned i = 0; i < NFAIL; i++) {
        if (a_completed[COOKIE_FAIL + i] == 0) {
            return 0;
        }
    }
    return 1;
}

static char job_key[65]; /* "" until drawn */

static ringbtl_t *make(uint32_t id) {
    ringbtl_config_t *cfg = NULL;
    CHECK(ringbtl_config_new(id, &cfg) == RINGBTL_OK && cfg != NULL, "config_new");
    if (job_key[0] != '\0') {
        CHECK(ringbtl_config_set(cfg, "RINGBTL_JOB_KEY", job_key) == RINGBTL_OK, "set key");
    }
    /* RINGBTL_BACKEND from the environment picks the backend under test */
    CHECK(ringbtl_config_from_env(cfg) == RINGBTL_OK, "config_from_env");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_MAX_FRAME", "64k") == RINGBTL_OK, "set max frame");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_RECV_CACHE", "128k") == RINGBTL_OK, "set recv cache");
    ringbtl_t *t = NULL;
    CHECK(ringbtl_create(cfg, &t) == RINGBTL_OK && t != NULL, "create %u", id);
    return t;
}

static void check_bad_input(void) {
    /* versions, texts */
    CHECK(ringbtl_abi_version() == RINGBTL_ABI_VERSION, "ABI version");
    CHECK(ringbtl_max_segments() == 8, "max segments");
    CHECK(strcmp(ringbtl_strerror(RINGBTL_ERR_UNKNOWN_PEER), ringbtl_strerror(12345)) != 0,
          "codes have texts");
    CHECK(ringbtl_strerror(12345) != NULL, "never NULL");

    /* configuration */
    ringbtl_config_t *cfg = NULL;
    CHECK(ringbtl_config_new(5, &cfg) == RINGBTL_OK, "config_new");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_NO_SUCH_THING", "1") == RINGBTL_ERR_CONFIG,
          "unknown setting");
    CHECK(strstr(ringbtl_last_error(), "RINGBTL_NO_SUCH_THING") != NULL, "names the setting");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_MAX_FRAME", "12") == RINGBTL_ERR_CONFIG, "range");
    CHECK(strstr(ringbtl_last_error(), "RINGBTL_MAX_FRAME") != NULL, "names the variable");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_BACKEND", "kqueue") == RINGBTL_ERR_CONFIG, "enum");
    CHECK(ringbtl_config_set(cfg, NULL, "1") == RINGBTL_ERR_INVALID, "NULL name");
    CHECK(ringbtl_config_set(NULL, "RINGBTL_MAX_FRAME", "1m") == RINGBTL_ERR_INVALID, "NULL");
    ringbtl_config_free(cfg);
    ringbtl_config_free(NULL);
    CHECK(ringbtl_create(NULL, NULL) == RINGBTL_ERR_INVALID, "create NULL");

    /* sends */
    unsigned char big[MAX_FRAME + 1];
    memset(big, 1, sizeof big);
    ringbtl_iov_t iov[9];
    for (int i = 0; i < 9; i++) {
        iov[i].base = big;
        iov[i].len = 1;
    }
    CHECK(ringbtl_send(A, 42, 1, iov, 1, 0) == RINGBTL_ERR_UNKNOWN_PEER, "unknown peer");
    CHECK(strstr(ringbtl_last_error(), "42") != NULL, "names the peer: %s",
          ringbtl_last_error());
    CHECK(ringbtl_send(A, 1, 1, iov, 9, 0) == RINGBTL_ERR_TOO_MANY_SEGMENTS, "9 segments");
    CHECK(strstr(ringbtl_last_error(), "9") != NULL, "says how many");
    iov[0].len = sizeof big;
    CHECK(ringbtl_send(A, 1, 1, iov, 1, 0) == RINGBTL_ERR_TOO_LARGE, "above max frame");
    CHECK(ringbtl_max_frame(A) == MAX_FRAME, "max frame %zu", ringbtl_max_frame(A));
    iov[0].base = NULL;
    CHECK(ringbtl_send(A, 1, 1, iov, 1, 0) == RINGBTL_ERR_INVALID, "NULL base");
    CHECK(ringbtl_send(A, 1, 1, NULL, 1, 0) == RINGBTL_ERR_INVALID, "NULL iov");
    CHECK(ringbtl_send(NULL, 1, 1, iov, 0, 0) == RINGBTL_ERR_INVALID, "NULL transport");
    CHECK(ringbtl_progress(NULL) == RINGBTL_ERR_INVALID, "NULL progress");
    CHECK(ringbtl_flush(NULL) == RINGBTL_ERR_INVALID, "NULL flush");
    CHECK(ringbtl_pending(A, 1) == 0, "nothing accepted");

    /* peers and tags */
    CHECK(ringbtl_add_peer(A, 3, "not a uri") == RINGBTL_ERR_INVALID, "bad URI list");
    CHECK(ringbtl_last_error()[0] != '\0', "with a message");
    CHECK(ringbtl_add_peer(A, 3, NULL) == RINGBTL_ERR_INVALID, "NULL URI list");
    CHECK(ringbtl_add_peer(A, 0, ringbtl_uris(A)) == RINGBTL_ERR_UNKNOWN_PEER, "itself");
    /* interface selection: a peer on no selected interface's network is unreachable */
    CHECK(ringbtl_config_new(2, &cfg) == RINGBTL_OK, "config_new");
    CHECK(ringbtl_config_from_env(cfg) == RINGBTL_OK, "config_from_env");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_LISTEN", "auto") == RINGBTL_OK, "listen auto");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_IF_INCLUDE", "lo") == RINGBTL_OK, "include lo");
    ringbtl_t *c = NULL;
    CHECK(ringbtl_create(cfg, &c) == RINGBTL_OK, "create with interface selection");
    CHECK(strstr(ringbtl_uris(c), "tcp://127.0.0.1:") != NULL, "%s", ringbtl_uris(c));
    CHECK(ringbtl_add_peer(c, 1, "tcp://10.99.99.99:1") == RINGBTL_ERR_UNREACHABLE, "route");
    CHECK(strstr(ringbtl_last_error(), "10.99.99.99") != NULL, "names the address");
    CHECK(ringbtl_add_peer(c, 1, ringbtl_uris(B)) == RINGBTL_OK, "loopback peer");
    CHECK(ringbtl_destroy(c, 0) == RINGBTL_OK, "destroy");
    CHECK(ringbtl_register(A, TAG_REPLY, a_on_reply, NULL) == RINGBTL_ERR_TAG_IN_USE, "taken");
    CHECK(ringbtl_register(A, 200, NULL, NULL) == RINGBTL_ERR_INVALID, "NULL callback");
    CHECK(ringbtl_unregister(A, 201) == RINGBTL_ERR_INVALID, "nothing to unregister");
    CHECK(ringbtl_destroy(NULL, 0) == RINGBTL_OK, "destroy NULL");
}

/* 4. links: C and D with RINGBTL_LINKS=2 */
enum { NLINKMSG = 200, TAG_LINK = 13 };
static unsigned link_got, link_bad, link_done;

static void on_link_msg(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    (void)ctx;
    (void)src;
    (void)tag;
    uint32_t seq = 0;
    if (len == sizeof seq) {
        memcpy(&seq, data, sizeof seq);
    }
    link_bad += len != sizeof seq || seq != link_got;
    link_got++;
}

static void on_link_done(void *ctx, uint32_t peer, uint64_t cookie, int status) {
    (void)ctx;
    (void)peer;
    (void)cookie;
    link_bad += status != RINGBTL_OK;
    link_done++;
}

static ringbtl_t *make_linked(uint32_t id) {
    ringbtl_config_t *cfg = NULL;
    CHECK(ringbtl_config_new(id, &cfg) == RINGBTL_OK, "config_new");
    CHECK(ringbtl_config_from_env(cfg) == RINGBTL_OK, "config_from_env");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_LINKS", "9") == RINGBTL_ERR_CONFIG, "links 9");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_LINKS", "2") == RINGBTL_OK, "links 2");
    ringbtl_t *t = NULL;
    CHECK(ringbtl_create(cfg, &t) == RINGBTL_OK, "create %u", id);
    return t;
}

static void check_links(void) {
    const char *ms = getenv("RINGBTL_RECV_MULTISHOT");
    size_t want = (ms != NULL && strcmp(ms, "1") == 0) ? 1 : 2;
    ringbtl_t *c = make_linked(20), *d = make_linked(21);
    CHECK(ringbtl_add_peer(c, 21, ringbtl_uris(d)) == RINGBTL_OK, "add d");
    CHECK(ringbtl_add_peer(d, 20, ringbtl_uris(c)) == RINGBTL_OK, "add c");
    CHECK(ringbtl_register(d, TAG_LINK, on_link_msg, NULL) == RINGBTL_OK, "register");
    ringbtl_on_complete(c, on_link_done, NULL);
    static uint32_t seqs[NLINKMSG];
    double deadline = now_s() + 20.0;
    for (uint32_t i = 0; i < NLINKMSG; i++) {
        seqs[i] = i;
        ringbtl_iov_t v = {&seqs[i], sizeof seqs[i]};
        CHECK(ringbtl_send(c, 21, TAG_LINK, &v, 1, i) == RINGBTL_OK, "send %u", i);
        CHECK(ringbtl_progress(c) >= 0 && ringbtl_progress(d) >= 0, "progress");
    }
    while (link_done < NLINKMSG || link_got < NLINKMSG || ringbtl_links_open(c, 21) < want ||
           ringbtl_links_open(d, 20) < want) {
        CHECK(now_s() < deadline, "links: stalled (%u done, %u got)", link_done, link_got);
        CHECK(ringbtl_progress(c) >= 0 && ringbtl_progress(d) >= 0, "progress");
    }
    CHECK(link_bad == 0 && link_got == NLINKMSG, "%u bad, %u got", link_bad, link_got);
    CHECK(ringbtl_links_open(c, 21) == want && ringbtl_links_open(d, 20) == want, "open");
    CHECK(ringbtl_links_open(c, 99) == 0 && ringbtl_links_open(NULL, 21) == 0, "none");
    ringbtl_link_stats_t st;
    CHECK(ringbtl_link_stats(c, &st) == RINGBTL_OK, "stats");
    CHECK(st.joined == want - 1 && st.lost == 0 && st.failovers == 0 && st.stalls == 0,
          "joined %llu lost %llu", (unsigned long long)st.joined, (unsigned long long)st.lost);
    CHECK(ringbtl_link_stats(NULL, &st) == RINGBTL_ERR_INVALID, "NULL transport");
    CHECK(ringbtl_link_stats(c, NULL) == RINGBTL_ERR_INVALID, "NULL out");
    CHECK(ringbtl_destroy(c, 1000) == RINGBTL_OK && ringbtl_destroy(d, 1000) == RINGBTL_OK,
          "destroy");
    printf("ok: %u messages in order over %zu connection(s) per peer\n", link_got, want);
}

/* Two jobs: the process 0 of each, with a key of its own, told only the other job's
 * public key; each calls the other by an id of its own choosing. */
enum { NJOBMSG = 50, TAG_JOB = 14 };
static unsigned job_got[2], job_bad, job_done;
static const uint32_t job_alias[2] = {7, 3}; /* what job 0 calls 1, and 1 calls 0 */

static void on_job_msg(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len) {
    unsigned me = (unsigned)(uintptr_t)ctx;
    (void)tag;
    uint32_t seq = 0;
    if (len == sizeof seq) {
        memcpy(&seq, data, sizeof seq);
    }
    job_bad += len != sizeof seq || seq != job_got[me] || src != job_alias[me];
    job_got[me]++;
}

static void on_job_done(void *ctx, uint32_t peer, uint64_t cookie, int status) {
    (void)ctx;
    (void)peer;
    (void)cookie;
    job_bad += status != RINGBTL_OK;
    job_done++;
}

static ringbtl_t *make_in_job(const char *token) {
    ringbtl_config_t *cfg = NULL;
    char key[65];
    CHECK(ringbtl_config_new(0, &cfg) == RINGBTL_OK, "config_new");
    CHECK(ringbtl_config_from_env(cfg) == RINGBTL_OK, "config_from_env");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_JOB_TOKEN", token) == RINGBTL_OK, "token");
    CHECK(ringbtl_generate_job_key(key) == RINGBTL_OK, "key");
    CHECK(ringbtl_config_set(cfg, "RINGBTL_JOB_KEY", key) == RINGBTL_OK, "set key");
    ringbtl_t *t = NULL;
    CHECK(ringbtl_create(cfg, &t) == RINGBTL_OK, "create job %s", token);
    return t;
}

static void check_jobs(void) {
    ringbtl_t *j[2] = {make_in_job("0xa1"), make_in_job("0xb2")};
    const uint64_t token[2] = {0xa1, 0xb2};
    char pub[2][65];
    for (int i = 0; i < 2; i++) {
        CHECK(ringbtl_job_public_key(j[i], pub[i]) == RINGBTL_OK, "public key");
        CHECK(strlen(pub[i]) == 64 && strspn(pub[i], "0123456789abcdef") == 64, "hex");
    }
    CHECK(strcmp(pub[0], pub[1]) != 0, "jobs' public keys differ");
    CHECK(ringbtl_job_public_key(NULL, pub[0]) == RINGBTL_ERR_INVALID, "NULL transport");
    CHECK(ringbtl_job_public_key(j[0], NULL) == RINGBTL_ERR_INVALID, "NULL out");
    CHECK(ringbtl_add_job(j[0], 0xb2, "abc") == RINGBTL_ERR_INVALID, "short key");
    CHECK(ringbtl_add_job(j[0], 0xb2, NULL) == RINGBTL_ERR_INVALID, "NULL key");
    CHECK(ringbtl_add_job(j[0], 0xa1, pub[1]) == RINGBTL_ERR_INVALID, "own job");
    CHECK(strstr(ringbtl_last_error(), "own job") != NULL, "%s", ringbtl_last_error());
    CHECK(ringbtl_add_peer_of_job(j[0], 7, 0xb2, 0, ringbtl_uris(j[1])) ==
              RINGBTL_ERR_UNKNOWN_PEER, "a job not added");
    for (int i = 0; i < 2; i++) {
        CHECK(ringbtl_add_job(j[i], token[1 - i], pub[1 - i]) == RINGBTL_OK, "add job");
        CHECK(ringbtl_add_peer_of_job(j[i], job_alias[i], token[1 - i], 0,
                                      ringbtl_uris(j[1 - i])) == RINGBTL_OK, "add peer");
        CHECK(ringbtl_register(j[i], TAG_JOB, on_job_msg, (void *)(uintptr_t)i) == RINGBTL_OK,
              "register");
        ringbtl_on_complete(j[i], on_job_done, NULL);
    }
    static uint32_t seqs[NJOBMSG];
    for (uint32_t k = 0; k < NJOBMSG; k++) {
        seqs[k] = k;
        ringbtl_iov_t v = {&seqs[k], sizeof seqs[k]};
        for (int i = 0; i < 2; i++) {
            CHECK(ringbtl_send(j[i], job_alias[i], TAG_JOB, &v, 1, k) == RINGBTL_OK, "send");
        }
    }
    double deadline = now_s() + 20.0;
    while (job_done < 2 * NJOBMSG || job_got[0] < NJOBMSG || job_got[1] < NJOBMSG) {
        CHECK(now_s() < deadline, "jobs: stalled (%u done, %u/%u got)", job_done, job_got[0],
              job_got[1]);
        CHECK(ringbtl_progress(j[0]) >= 0 && ringbtl_progress(j[1]) >= 0, "progress");
    }
    CHECK(job_bad == 0, "%u bad", job_bad);
    CHECK(ringbtl_destroy(j[0], 1000) == RINGBTL_OK && ringbtl_destroy(j[1], 1000) == RINGBTL_OK,
          "destroy");
    printf("ok: %u messages each way between two jobs\n", NJOBMSG);
}

int main(void) {
    A = make(0);
    B = make(1);
    CHECK(ringbtl_local_id(A) == 0 && ringbtl_local_id(B) == 1, "ids");
    /* a job key, set on both before their first connection */
    CHECK(ringbtl_generate_job_key(NULL) == RINGBTL_ERR_INVALID, "NULL out");
    CHECK(ringbtl_generate_job_key(job_key) == RINGBTL_OK, "generate key");
    CHECK(strlen(job_key) == 64 && strspn(job_key, "0123456789abcdef") == 64, "%s", "hex");
    char other[65];
    CHECK(ringbtl_generate_job_key(other) == RINGBTL_OK && strcmp(other, job_key) != 0,
          "fresh keys differ");
    CHECK(ringbtl_set_job_key(A, "abc") == RINGBTL_ERR_INVALID, "short key");
    CHECK(strstr(ringbtl_last_error(), "64") != NULL, "says what is expected");
    CHECK(ringbtl_set_job_key(A, NULL) == RINGBTL_ERR_INVALID, "NULL key");
    CHECK(ringbtl_set_job_key(NULL, job_key) == RINGBTL_ERR_INVALID, "NULL transport");
    CHECK(ringbtl_set_job_key(A, job_key) == RINGBTL_OK, "key of A");
    CHECK(ringbtl_set_job_key(B, job_key) == RINGBTL_OK, "key of B");
    const char *backend = ringbtl_backend_name(A);
    CHECK(strcmp(backend, "uring") == 0 || strcmp(backend, "epoll") == 0, "%s", backend);
    CHECK(strncmp(ringbtl_uris(B), "tcp://", 6) == 0, "%s", ringbtl_uris(B));
    CHECK(ringbtl_add_peer(A, 1, ringbtl_uris(B)) == RINGBTL_OK, "add B");
    CHECK(ringbtl_add_peer(B, 0, ringbtl_uris(A)) == RINGBTL_OK, "add A");

    CHECK(ringbtl_register(B, TAG_DATA, b_on_data, &b_received) == RINGBTL_OK, "register");
    CHECK(ringbtl_register(B, TAG_LATE, b_on_late, NULL) == RINGBTL_OK, "register");
    CHECK(ringbtl_register(B, TAG_ONCE, b_on_once, NULL) == RINGBTL_OK, "register");
    CHECK(ringbtl_register(A, TAG_REPLY, a_on_reply, NULL) == RINGBTL_OK, "register");
    ringbtl_on_complete(A, a_on_complete, a_completed);
    ringbtl_on_complete(B, b_on_complete, NULL);
    ringbtl_on_error(A, a_on_error, NULL);

    check_bad_input();

    /* 1. gather sends, every byte and completion checked */
    for (unsigned i = 0; i < NMSG; i++) {
        size_t len = msg_len(i);
        bufs[i] = malloc(len);
        CHECK(bufs[i] != NULL, "malloc");
        put_index(bufs[i], i);
        for (size_t j = 4; j < len; j++) {
            bufs[i][j] = pattern(i, j);
        }
        size_t nseg = 1 + i % 8;
        if (nseg > len) {
            nseg = len;
        }
        CHECK(send_split(A, 1, TAG_DATA, bufs[i], len, nseg, i) == RINGBTL_OK, "send %u", i);
        if (i % 50 == 49) {
            CHECK(ringbtl_progress(A) >= 0, "progress");
        }
    }
    drive(all_data_done, "data", 1);
    CHECK(ringbtl_pending(A, 1) == 0 && ringbtl_pending(B, 0) == 0, "nothing pending");
    CHECK(b_nested_zero == NMSG && a_nested_zero == 1, "nested calls");
    printf("ok: %u gather sends checked byte for byte, %u replies from callbacks (%s)\n",
           NMSG, a_replies, backend);

    /* 2. a callback that unregisters itself, then registration again */
    static const char one[] = "x";
    ringbtl_iov_t iov = {one, 1};
    for (unsigned k = 0; k < 3; k++) {
        CHECK(ringbtl_send(A, 1, TAG_ONCE, &iov, 1, COOKIE_ONCE + k) == RINGBTL_OK, "once");
    }
    /* a marker behind them: once it arrived, so did the three (per-peer order) */
    static const char late[] = "late!";
    ringbtl_iov_t marker = {late, 5};
    CHECK(ringbtl_send(A, 1, TAG_LATE, &marker, 1, COOKIE_LATE + 1) == RINGBTL_OK, "marker");
    drive(marker_done, "once", 1);
    /* the ones after the unregistration were dropped (no callback for the tag) */
    CHECK(b_once == 1, "the callback ran %u times after unregistering itself", b_once);
    CHECK(ringbtl_register(B, TAG_ONCE, b_on_once, NULL) == RINGBTL_OK, "register again");
    CHECK(ringbtl_send(A, 1, TAG_ONCE, &iov, 1, COOKIE_ONCE + 3) == RINGBTL_OK, "once more");
    drive(reregistered_done, "re-registered", 1);
    printf("ok: unregister inside its own callback, register again\n");

    /* 2b. ringbtl_flush puts a queued send on the wire with no pass on the sender: only B
     * progresses until the message is in */
    CHECK(ringbtl_register(B, TAG_ONCE, b_on_once, NULL) == RINGBTL_OK, "register once more");
    CHECK(ringbtl_send(A, 1, TAG_ONCE, &iov, 1, COOKIE_ONCE + 4) == RINGBTL_OK, "flushed");
    CHECK(ringbtl_flush(A) == RINGBTL_OK, "flush");
    CHECK(ringbtl_flush(A) == RINGBTL_OK, "flush with nothing queued");
    double flush_deadline = now_s() + 20.0;
    while (b_once != 3) {
        CHECK(now_s() < flush_deadline, "flushed send never arrived");
        CHECK(ringbtl_progress(B) >= 0, "progress B");
    }
    CHECK(a_completed[COOKIE_ONCE + 4] == 0, "no completion runs inside flush");
    printf("ok: flush without progress on the sender\n");

    /* 2d. puts into a region B registered: 100 B in one segment, 60,000 B in three */
    region = calloc(REGION_LEN, 1);
    CHECK(region != NULL, "calloc");
    uint64_t key = 0;
    CHECK(ringbtl_register_region(B, NULL, 10, RINGBTL_REGION_PEER_WRITE, &key) == RINGBTL_ERR_INVALID, "NULL base");
    CHECK(ringbtl_register_region(B, region, 10, RINGBTL_REGION_PEER_WRITE, NULL) == RINGBTL_ERR_INVALID, "NULL key");
    CHECK(ringbtl_register_region(NULL, region, 10, RINGBTL_REGION_PEER_WRITE, &key) == RINGBTL_ERR_INVALID, "NULL t");
    CHECK(ringbtl_register_region(B, region, REGION_LEN, RINGBTL_REGION_PEER_WRITE, &key) == RINGBTL_OK, "register");
    CHECK(ringbtl_deregister_region(B, key + 1) == RINGBTL_ERR_INVALID, "unknown key");
    CHECK(strstr(ringbtl_last_error(), "region") != NULL, "%s", ringbtl_last_error());
    CHECK(ringbtl_register(B, TAG_PUT_DONE, b_on_put_done, NULL) == RINGBTL_OK, "register");
    static unsigned char small[100], big[60000];
    for (size_t j = 0; j < sizeof small; j++) {
        small[j] = region_want(10 + j);
    }
    for (size_t j = 0; j < sizeof big; j++) {
        big[j] = region_want(1000 + j);
    }
    uint64_t at = (uint64_t)(uintptr_t)region;
    ringbtl_iov_t one_seg = {small, sizeof small};
    CHECK(ringbtl_put(A, 1, key, at + 10, &one_seg, 1, COOKIE_ONCE + 10) == RINGBTL_OK,
          "put 100 B");
    ringbtl_iov_t three[3] = {{big, 1}, {big + 1, 30000}, {big + 30001, sizeof big - 30001}};
    CHECK(ringbtl_put(A, 1, key, at + 1000, three, 3, COOKIE_ONCE + 11) == RINGBTL_OK,
          "put 60,000 B");
    CHECK(ringbtl_put(A, 1, key, at, three, 9, COOKIE_ONCE + 13) == RINGBTL_ERR_TOO_MANY_SEGMENTS,
          "nine segments");
    CHECK(ringbtl_send(A, 1, TAG_PUT_DONE, &iov, 1, COOKIE_ONCE + 12) == RINGBTL_OK, "marker");
    drive(put_done, "puts", 1);
    for (unsigned k = 10; k < 13; k++) {
        CHECK(a_status[COOKIE_ONCE + k] == RINGBTL_OK, "put %u: %d", k, a_status[COOKIE_ONCE + k]);
    }
    CHECK(ringbtl_deregister_region(B, key) == RINGBTL_OK, "deregister");
    CHECK(ringbtl_deregister_region(B, key) == RINGBTL_ERR_INVALID, "deregister twice");
    free(region);
    printf("ok: puts placed in a registered region before the next message\n");

    /* 2e. a get: A reads 50,001 bytes of a region B registered for peers' reads into a
     * region of its own registered for nothing else (flags 0) */
    enum { GET_LEN = 50001 };
    unsigned char *src = malloc(REGION_LEN), *dst = calloc(REGION_LEN, 1);
    CHECK(src != NULL && dst != NULL, "malloc");
    for (size_t j = 0; j < REGION_LEN; j++) {
        src[j] = region_want(j);
    }
    uint64_t src_key = 0, dst_key = 0;
    CHECK(ringbtl_register_region(B, src, REGION_LEN, 4, &src_key) == RINGBTL_ERR_INVALID,
          "unknown flags");
    CHECK(ringbtl_register_region(B, src, REGION_LEN, RINGBTL_REGION_PEER_READ, &src_key) ==
              RINGBTL_OK, "register the source");
    CHECK(ringbtl_register_region(A, dst, REGION_LEN, 0, &dst_key) == RINGBTL_OK,
          "register the destination");
    uint64_t src_at = (uint64_t)(uintptr_t)src, dst_at = (uint64_t)(uintptr_t)dst;
    CHECK(ringbtl_get(A, 1, src_key, src_at + 3, GET_LEN, dst_key, dst_at + REGION_LEN - 10,
                      COOKIE_ONCE + 21) == RINGBTL_ERR_INVALID, "destination past the region");
    CHECK(strstr(ringbtl_last_error(), "region") != NULL, "%s", ringbtl_last_error());
    CHECK(ringbtl_get(A, 1, src_key, src_at + 3, GET_LEN, dst_key, dst_at + 5,
                      COOKIE_ONCE + 20) == RINGBTL_OK, "get");
    drive(get_done, "get", 1);
    CHECK(a_status[COOKIE_ONCE + 20] == RINGBTL_OK, "get: %d", a_status[COOKIE_ONCE + 20]);
    CHECK(a_completed[COOKIE_ONCE + 21] == 0, "a refused get completes nothing");
    CHECK(memcmp(dst + 5, src + 3, GET_LEN) == 0, "the bytes got");
    CHECK(dst[4] == 0 && dst[5 + GET_LEN] == 0, "nothing around them");
    CHECK(ringbtl_deregister_region(A, dst_key) == RINGBTL_OK, "deregister the destination");
    double get_deadline = now_s() + 20.0;
    int drc;
    while ((drc = ringbtl_deregister_region(B, src_key)) == RINGBTL_ERR_BUSY) {
        CHECK(now_s() < get_deadline, "the source stays in use");
        CHECK(ringbtl_progress(A) >= 0, "progress A");
        CHECK(ringbtl_progress(B) >= 0, "progress B");
    }
    CHECK(drc == RINGBTL_OK, "deregister the source: %d", drc);
    free(src);
    free(dst);
    printf("ok: a get placed the peer's bytes in our region\n");

    /* 2c. lazy add: processes 2 and 3 know A, A knows neither; A's resolver adds 2 and
     * accepts it, and declines 3 */
    static unsigned lz_index[2] = {0, 1};
    static unsigned char lazy_buf[NLAZY][4];
    CHECK(ringbtl_register(A, TAG_LAZY, a_on_lazy, NULL) == RINGBTL_OK, "register lazy");
    ringbtl_on_unknown_peer(A, a_resolve, lazy_asked);
    for (unsigned k = 0; k < 2; k++) {
        LZ[k] = make(2 + k);
        CHECK(ringbtl_add_peer(LZ[k], 0, ringbtl_uris(A)) == RINGBTL_OK, "add A");
        ringbtl_on_complete(LZ[k], lz_on_complete, &lz_index[k]);
        ringbtl_on_error(LZ[k], lz_on_error, NULL);
    }
    for (unsigned i = 0; i < NLAZY; i++) {
        put_index(lazy_buf[i], i);
        ringbtl_iov_t v = {lazy_buf[i], 4};
        CHECK(ringbtl_send(LZ[0], 0, TAG_LAZY, &v, 1, i) == RINGBTL_OK, "lazy send %u", i);
    }
    ringbtl_iov_t v3 = {lazy_buf[0], 4};
    CHECK(ringbtl_send(LZ[1], 0, TAG_LAZY, &v3, 1, 0) == RINGBTL_OK, "declined send");
    double lazy_deadline = now_s() + 20.0;
    while (!lazy_done_all()) {
        CHECK(now_s() < lazy_deadline, "lazy add stalled: got %u, done %u/%u, failed %u",
              lazy_got, lazy_done[0], lazy_done[1], lazy_failed);
        CHECK(ringbtl_progress(A) >= 0, "progress A");
        CHECK(ringbtl_progress(LZ[0]) >= 0, "progress 2");
        CHECK(ringbtl_progress(LZ[1]) >= 0, "progress 3");
    }
    CHECK(lazy_asked[0] == 1 && lazy_asked[1] == 1, "asked once each: %u %u", lazy_asked[0],
          lazy_asked[1]);
    CHECK(lazy_status[0] == RINGBTL_OK, "accepted peer's sends: %d", lazy_status[0]);
    CHECK(lazy_status[1] == RINGBTL_ERR_PROTOCOL, "declined peer's send: %d", lazy_status[1]);
    ringbtl_on_unknown_peer(A, NULL, NULL);
    /* process 2's FIN leaves at once; A is not progressing, so the drain is short */
    CHECK(ringbtl_destroy(LZ[0], 50) == RINGBTL_OK, "destroy 2");
    CHECK(ringbtl_destroy(LZ[1], 0) == RINGBTL_OK, "destroy 3");
    printf("ok: lazy add: unknown process added and accepted by the resolver, another "
           "declined\n");

    /* 3. B goes away while A's sends to it are in flight: each completes exactly once */
    for (unsigned i = 0; i < NFAIL; i++) {
        memset(fail_buf[i], (int)i, sizeof fail_buf[i]);
        CHECK(send_split(A, 1, TAG_DATA + 100, fail_buf[i], sizeof fail_buf[i], 2,
                         COOKIE_FAIL + i) == RINGBTL_OK,
              "send %u", i);
    }
    for (int k = 0; k < 50; k++) {
        CHECK(ringbtl_progress(A) >= 0, "progress A");
    }
    CHECK(ringbtl_destroy(B, 20) == RINGBTL_OK, "destroy B");
    B = NULL;
    drive(fail_done, "sends to a destroyed peer", 0);
    unsigned ok = 0, failed = 0;
    for (unsigned i = 0; i < NFAIL; i++) {
        int s = a_status[COOKIE_FAIL + i];
        CHECK(s == RINGBTL_OK || s == RINGBTL_ERR_UNREACHABLE || s == RINGBTL_ERR_PEER_CLOSED,
              "status %d", s);
        if (s == RINGBTL_OK) {
            ok++;
        } else {
            failed++;
        }
    }
    CHECK(a_errors <= 1, "one error callback at most: %u", a_errors);
    CHECK(ringbtl_pending(A, 1) == 0, "nothing pending");
    for (unsigned c = 0; c < COOKIE_MAX; c++) {
        CHECK(a_completed[c] <= 1, "cookie %u completed %u times", c, a_completed[c]);
    }
    printf("ok: peer destroyed with sends in flight: %u completed ok, %u failed, %u error "
           "callbacks\n",
           ok, failed, a_errors);

    CHECK(ringbtl_destroy(A, 1000) == RINGBTL_OK, "destroy A");
    printf("ok: destroyed\n");
    check_links();
    check_jobs();
    return 0;
}
