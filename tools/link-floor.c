/*
 * link-floor: plain TCP against the kernel's Multipath TCP (IPPROTO_MPTCP) between two
 * hosts, the same program on both sides with only the protocol changed: a checked stream
 * (throughput, and the longest time in which no byte arrived: the stall of a failover when
 * a link goes down mid-stream), a busy-polled ping-pong, and a probe of the zero-copy paths
 * (SO_ZEROCOPY / MSG_ZEROCOPY, splice, io_uring send, recv and send_zc) on a connected
 * socket. It is the floor under the question whether ringbtl stripes and fails over across
 * links itself or leaves that to MPTCP; tools/mptcp-compare.sh runs it between namespace
 * hosts.
 *
 * Usage: link-floor server --proto tcp|mptcp [--bind ADDR] [--port P] [--count K]
 *                          [--cpu C] [--idle-timeout S]
 *        link-floor client --proto tcp|mptcp --mode stream|pingpong|probe --addr ADDR
 *                          [--port P] [--bytes N] [--both] [--rate MBPS] [--chunk N]
 *                          [--user-timeout MS] [--deadline S] [--size S] [--iters N]
 *                          [--cpu C] [--cc ALGO]
 *   The server serves K connections (default 1) one after the other, each in the mode the
 *   client names in its first 24 bytes; the client retries its connect for 5 s, so the two
 *   may start together. Port default 47300.
 *   stream: the client sends N bytes (--bytes, default 64 MiB; K, M, G suffixes) of a
 *     pattern derived from each byte's position (64-bit words (i + seed) * 2^64/phi), the
 *     server checks every byte; --both: the server sends N bytes back at the same time, and
 *     the client checks them. --rate: the sender holds itself to MBPS (10^6 bytes/s), so
 *     that a stream lasts long enough for links to be taken down and up beneath it.
 *     --user-timeout: TCP_USER_TIMEOUT on the client's socket (the setsockopt's result is
 *     printed, not fatal). --deadline: the client gives up after S seconds (default 120);
 *     --idle-timeout: the server gives up after S seconds without a byte (default 60).
 *   pingpong: SIZE-byte messages (--size, default 8) bounced --iters times (default
 *     20000, after 2000 unmeasured), non-blocking send and recv spun (spin.h).
 *   probe: each zero-copy path tried once on the connection; the server sends 256 KiB
 *     first, for the receiving paths, and counts what arrives.
 * Prints one JSON line per side and connection:
 *   stream, receiver:  {"bench":"link-floor","mode":"stream","side":..,"proto":..,
 *     "dir":"recv","bytes":..,"mbps":..,"max_gap_ms":..,"gap_at_ms":..,"gap_offset":..,
 *     "ok":true}  (mbps: 10^6 bytes/s from the first byte to the last; a mismatch prints
 *     "ok":false and the first wrong offset, and exits 1)
 *   stream, client: {..,"dir":"send","bytes":..,"mbps":..,"user_timeout":"ok"|errno,
 *     "error":..|null,"error_at_unix":..,"mptcp":{"fallback":..,"subflows":..,
 *     "subflow":[{"local":..,"remote":..,"bytes_sent":..,"retrans":..},..]}}
 *     (mbps from the first byte sent to the server's end of stream, which follows its
 *     last check)
 *   pingpong, client:  {..,"mode":"pingpong","size":..,"iters":..,"p50_us":..,"p99_us":..}
 *     (one-way = round trip / 2)
 *   probe, client:  {..,"mode":"probe","so_zerocopy":..,"msg_zerocopy":..,
 *     "splice_to_sock":..,"splice_from_sock":..,"uring_send":..,"uring_recv":..,
 *     "uring_send_zc":..}  (each "ok" with what it moved, or the errno's name)
 * Exit: 0 done, 1 a wrong byte or a fatal error, 3 the connection failed, or this program
 *   gave up at --deadline or --idle-timeout (the error is in the JSON line: the errno's
 *   name, or "gave up ...").
 * Build: cc -O2 -Wall -Wextra -Werror -o link-floor link-floor.c   (with spin.h beside it)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <linux/errqueue.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "spin.h"

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif
#ifndef SOL_MPTCP
#define SOL_MPTCP 284
#endif
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
/* From linux/mptcp.h, which clashes with netinet/in.h on some systems. */
#define LF_MPTCP_INFO 1
#define LF_MPTCP_TCPINFO 2
#define LF_MPTCP_SUBFLOW_ADDRS 3
#define LF_MPTCP_FALLBACK 1u
struct lf_mptcp_info {
    uint8_t subflows, add_addr_signal, add_addr_accepted, subflows_max;
    uint8_t add_addr_signal_max, add_addr_accepted_max;
    uint32_t flags, token;
    uint64_t write_seq, snd_una, rcv_nxt;
    uint8_t local_addr_used, local_addr_max, csum_enabled;
};
struct lf_subflow_data {
    uint32_t size_subflow_data, num_subflows, size_kernel, size_user;
} __attribute__((aligned(8)));
/* struct tcp_info of linux/tcp.h up to tcpi_bytes_retrans (glibc's ends earlier). */
struct lf_tcp_info {
    uint8_t state, ca_state, retransmits, probes, backoff, options, wscale, flags;
    uint32_t rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets;
    uint32_t last_data_sent, last_ack_sent, last_data_recv, last_ack_recv;
    uint32_t pmtu, rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd, advmss, reordering;
    uint32_t rcv_rtt, rcv_space, total_retrans;
    uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
    uint32_t segs_out, segs_in, notsent_bytes, min_rtt, data_segs_in, data_segs_out;
    uint64_t delivery_rate, busy_time, rwnd_limited, sndbuf_limited;
    uint32_t delivered, delivered_ce;
    uint64_t bytes_sent, bytes_retrans;
};
struct lf_subflow_addrs {
    union {
        struct sockaddr_in sin;
        struct sockaddr_storage ss;
    } local, remote;
};

#define MAX_SUBFLOWS 8
#define HELLO_MAGIC 0x464b4e4cu /* "LNKF" */
enum { MODE_STREAM = 1, MODE_PINGPONG = 2, MODE_PROBE = 3 };
/* The client's first bytes: what the server is to do. */
struct hello {
    uint32_t magic, mode;
    uint64_t bytes;
    uint32_t size, both;
};

static struct {
    int server, proto, mode, port, count, cpu, both, user_timeout, size;
    const char *bind, *addr, *cc, *proto_name;
    uint64_t bytes;
    long iters;
    size_t chunk;
    double rate, deadline, idle;
} o = {
    .port = 47300, .count = 1, .cpu = -1, .size = 8, .bytes = 64ull << 20,
    .iters = 20000, .chunk = 256 << 10, .deadline = 120, .idle = 60,
};

static double real_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- the pattern ---- */

static inline uint64_t word(uint64_t i, uint64_t seed)
{
    return (i + seed) * 0x9E3779B97F4A7C15ull;
}

/* The pattern's bytes [off, off + len) into dst. */
static void fill(char *dst, uint64_t off, size_t len, uint64_t seed)
{
    uint64_t i = off / 8;
    size_t skip = (size_t)(off % 8);
    while (len > 0) {
        uint64_t w = word(i++, seed);
        size_t k = 8 - skip < len ? 8 - skip : len;
        memcpy(dst, (char *)&w + skip, k);
        dst += k;
        len -= k;
        skip = 0;
    }
}

/* ---- sockets ---- */

static int new_socket(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, o.proto);
    if (fd < 0)
        die(o.proto == IPPROTO_MPTCP ? "socket(IPPROTO_MPTCP)" : "socket");
    return fd;
}

static void set_nonblocking(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) != 0)
        die("fcntl");
}

static void sock_opts(int fd)
{
    if (o.cc)
        nodelay_cc(fd, o.cc);
    else
        nodelay(fd);
}

static struct sockaddr_in sin_of(const char *a, int port)
{
    struct sockaddr_in s;
    memset(&s, 0, sizeof s);
    s.sin_family = AF_INET;
    s.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, a, &s.sin_addr) != 1) {
        fprintf(stderr, "link-floor: bad address %s\n", a);
        exit(2);
    }
    return s;
}

static int connect_retry(void)
{
    struct sockaddr_in a = sin_of(o.addr, o.port);
    double t0 = now_us();
    for (;;) {
        int fd = new_socket();
        sock_opts(fd);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        if ((errno != ECONNREFUSED && errno != ENETUNREACH) || now_us() - t0 > 5e6)
            die("connect");
        close(fd);
        usleep(20000);
    }
}

/* The error of a stream that this program ended: --deadline or --idle-timeout passed. */
#define GAVE_UP (-1)

static const char *err_name(int e)
{
    if (e == GAVE_UP)
        return "gave up (--deadline or --idle-timeout)";
    const char *n = strerrorname_np(e);
    return n ? n : "unknown";
}

/* The MPTCP view of a connection, as a JSON value; "null" for a plain TCP socket. */
static void mptcp_json(int fd, char *out, size_t cap)
{
    struct lf_mptcp_info mi;
    socklen_t l = sizeof mi;
    memset(&mi, 0, sizeof mi);
    if (o.proto != IPPROTO_MPTCP || getsockopt(fd, SOL_MPTCP, LF_MPTCP_INFO, &mi, &l) != 0) {
        snprintf(out, cap, o.proto == IPPROTO_MPTCP ? "{\"info\":\"%s\"}" : "null",
                 err_name(errno));
        return;
    }
    struct {
        struct lf_subflow_data h;
        struct lf_tcp_info t[MAX_SUBFLOWS];
    } ti;
    struct {
        struct lf_subflow_data h;
        struct lf_subflow_addrs a[MAX_SUBFLOWS];
    } sa;
    memset(&ti, 0, sizeof ti);
    memset(&sa, 0, sizeof sa);
    ti.h.size_subflow_data = sa.h.size_subflow_data = sizeof(struct lf_subflow_data);
    ti.h.size_user = sizeof(struct lf_tcp_info);
    sa.h.size_user = sizeof(struct lf_subflow_addrs);
    socklen_t tl = sizeof ti, al = sizeof sa;
    int ht = getsockopt(fd, SOL_MPTCP, LF_MPTCP_TCPINFO, &ti, &tl) == 0;
    int ha = getsockopt(fd, SOL_MPTCP, LF_MPTCP_SUBFLOW_ADDRS, &sa, &al) == 0;
    size_t n = snprintf(out, cap, "{\"fallback\":%s,\"subflows\":%u,\"subflow\":[",
                        mi.flags & LF_MPTCP_FALLBACK ? "true" : "false", mi.subflows);
    uint32_t k = ht ? ti.h.num_subflows : 0;
    if (k > MAX_SUBFLOWS)
        k = MAX_SUBFLOWS;
    for (uint32_t i = 0; i < k && n < cap; i++) {
        char la[INET_ADDRSTRLEN] = "?", ra[INET_ADDRSTRLEN] = "?";
        if (ha && i < sa.h.num_subflows && sa.a[i].local.sin.sin_family == AF_INET) {
            inet_ntop(AF_INET, &sa.a[i].local.sin.sin_addr, la, sizeof la);
            inet_ntop(AF_INET, &sa.a[i].remote.sin.sin_addr, ra, sizeof ra);
        }
        n += snprintf(out + n, cap - n,
                      "%s{\"local\":\"%s\",\"remote\":\"%s\",\"bytes_sent\":%llu,"
                      "\"bytes_received\":%llu,\"retrans\":%u}",
                      i ? "," : "", la, ra, (unsigned long long)ti.t[i].bytes_sent,
                      (unsigned long long)ti.t[i].bytes_received,
                      ti.t[i].total_retrans);
    }
    if (n < cap)
        snprintf(out + n, cap - n, "]}");
}

/* ---- stream ---- */

struct stream {
    uint64_t to_send, sent, to_recv, got, seed_out, seed_in;
    int shut, eof, err;
    double start, first, last, max_gap, gap_at, err_at_real, last_progress, snap_at;
    uint64_t gap_off;
    char mptcp[2048]; /* the sender's last view of its subflows while the stream ran */
};

/* Checks the r bytes just received at the stream's offset s->got; exits 1 on a wrong one. */
static void check(struct stream *s, const char *b, size_t r, char *want)
{
    fill(want, s->got, r, s->seed_in);
    if (r > 0 && memcmp(b, want, r) == 0 && s->got + r <= s->to_recv)
        return; /* r == 0: the stream ended short */
    size_t i = 0;
    while (i < r && b[i] == want[i])
        i++;
    printf("{\"bench\":\"link-floor\",\"mode\":\"stream\",\"side\":\"%s\",\"proto\":\"%s\","
           "\"dir\":\"recv\",\"ok\":false,\"bad_offset\":%llu,\"expected_bytes\":%llu}\n",
           o.server ? "server" : "client", o.proto_name, (unsigned long long)(s->got + i),
           (unsigned long long)s->to_recv);
    fflush(stdout);
    exit(1);
}

/* Moves the stream both ways until both ends are done: sends to_send bytes then shuts the
 * write side, receives (and checks) until the peer's end of stream. Returns 0, or the errno
 * of a failed send or recv, or ETIMEDOUT at the deadline or idle timeout. */
static int run_stream(int fd, struct stream *s)
{
    size_t chunk = o.chunk;
    char *out = malloc(chunk), *in = malloc(chunk), *want = malloc(chunk);
    uint64_t out_off = 0, out_len = 0;
    if (!out || !in || !want)
        die("malloc");
    set_nonblocking(fd, 1);
    s->start = s->last_progress = now_us();
    for (;;) {
        if (s->to_send > 0 && (now_us() - s->snap_at > 100e3 || s->sent == s->to_send) &&
            !s->shut) {
            mptcp_json(fd, s->mptcp, sizeof s->mptcp);
            s->snap_at = now_us();
        }
        if (s->sent == s->to_send && !s->shut) {
            if (shutdown(fd, SHUT_WR) != 0)
                return s->err = errno;
            s->shut = 1;
        }
        if (s->shut && s->eof)
            return 0;
        double t = now_us();
        /* The sender's allowance under --rate (only the client sends at a rate). */
        int may_send = s->sent < s->to_send;
        int wait_ms = 100;
        if (may_send && o.rate > 0 && !o.server) {
            double allowed = o.rate * (t - s->start); /* MB/s * us = bytes */
            if ((double)s->sent >= allowed) {
                may_send = 0;
                wait_ms = 1;
            }
        }
        if (!o.server && t - s->start > o.deadline * 1e6)
            return s->err = GAVE_UP;
        if (o.server && t - (s->first > 0 ? s->last : s->start) > o.idle * 1e6)
            return s->err = GAVE_UP;
        struct pollfd p = {fd, (short)((may_send ? POLLOUT : 0) | (s->eof ? 0 : POLLIN)), 0};
        if (p.events == 0) {
            usleep(1000);
            continue;
        }
        if (poll(&p, 1, wait_ms) < 0 && errno != EINTR)
            die("poll");
        if (!s->eof && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            for (;;) {
                ssize_t r = recv(fd, in, chunk, MSG_DONTWAIT);
                if (r > 0) {
                    double now = now_us();
                    if (s->first == 0)
                        s->first = now;
                    else if (now - s->last > s->max_gap) {
                        s->max_gap = now - s->last;
                        s->gap_at = s->last - s->first;
                        s->gap_off = s->got;
                    }
                    s->last = now;
                    check(s, in, (size_t)r, want);
                    s->got += (uint64_t)r;
                } else if (r == 0) {
                    s->eof = 1;
                    if (s->got != s->to_recv)
                        check(s, in, 0, want); /* reports the short stream */
                    break;
                } else {
                    if (errno == EAGAIN || errno == EINTR)
                        break;
                    return s->err = errno;
                }
            }
        }
        if (may_send && (p.revents & (POLLOUT | POLLERR))) {
            uint64_t room = s->to_send - s->sent;
            if (o.rate > 0 && !o.server) {
                double allowed = o.rate * (now_us() - s->start) - (double)s->sent;
                if ((double)room > allowed)
                    room = allowed > 1 ? (uint64_t)allowed : 1;
            }
            if (s->sent >= out_off + out_len) {
                out_off = s->sent;
                out_len = s->to_send - out_off < chunk ? s->to_send - out_off : chunk;
                fill(out, out_off, (size_t)out_len, s->seed_out);
            }
            uint64_t avail = out_off + out_len - s->sent;
            ssize_t r = send(fd, out + (s->sent - out_off), avail < room ? avail : room,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (r > 0) {
                s->sent += (uint64_t)r;
                s->last_progress = now_us();
            } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
                return s->err = errno;
            }
        }
    }
}

static void stream_json(struct stream *s, int fd, int as_sender, const char *extra)
{
    double end = now_us();
    if (as_sender) {
        if (!s->mptcp[0])
            mptcp_json(fd, s->mptcp, sizeof s->mptcp);
        double secs = (end - s->start) / 1e6;
        printf("{\"bench\":\"link-floor\",\"mode\":\"stream\",\"side\":\"%s\",\"proto\":\"%s\","
               "\"dir\":\"send\",\"bytes\":%llu,\"mbps\":%.1f,%s\"error\":",
               o.server ? "server" : "client", o.proto_name, (unsigned long long)s->sent,
               (double)s->sent / 1e6 / secs, extra);
        if (s->err)
            printf("\"%s\",\"error_at_unix\":%.3f,\"error_after_progress_ms\":%.0f",
                   err_name(s->err), s->err_at_real, (end - s->last_progress) / 1e3);
        else
            printf("null");
        printf(",\"mptcp\":%s}\n", s->mptcp);
    }
    if (s->to_recv > 0 || !as_sender) {
        double secs = s->last > s->first ? (s->last - s->first) / 1e6 : 1e-9;
        printf("{\"bench\":\"link-floor\",\"mode\":\"stream\",\"side\":\"%s\",\"proto\":\"%s\","
               "\"dir\":\"recv\",\"bytes\":%llu,\"mbps\":%.1f,\"max_gap_ms\":%.2f,"
               "\"gap_at_ms\":%.1f,\"gap_offset\":%llu,\"ok\":%s%s%s%s}\n",
               o.server ? "server" : "client", o.proto_name, (unsigned long long)s->got,
               (double)s->got / 1e6 / secs, s->max_gap / 1e3, s->gap_at / 1e3,
               (unsigned long long)s->gap_off, s->err ? "false" : "true",
               s->err ? ",\"error\":\"" : "", s->err ? err_name(s->err) : "",
               s->err ? "\"" : "");
    }
    fflush(stdout);
}

/* ---- ping-pong ---- */

static void pingpong_server(int fd, size_t size)
{
    char *b = malloc(size);
    if (!b)
        die("malloc");
    while (spin_recv(fd, b, size))
        spin_send(fd, b, size);
    free(b);
}

static void pingpong_client(int fd)
{
    size_t size = (size_t)o.size;
    long warm = 2000;
    char *b = malloc(size);
    double *t = malloc(sizeof(double) * (size_t)o.iters);
    if (!b || !t)
        die("malloc");
    memset(b, 0x5a, size);
    for (long i = 0; i < warm + o.iters; i++) {
        double t0 = now_us();
        spin_send(fd, b, size);
        recv_all(fd, b, size);
        if (i >= warm)
            t[i - warm] = (now_us() - t0) / 2;
    }
    qsort(t, (size_t)o.iters, sizeof *t, by_value);
    char mp[2048];
    mptcp_json(fd, mp, sizeof mp);
    printf("{\"bench\":\"link-floor\",\"mode\":\"pingpong\",\"side\":\"client\",\"proto\":\"%s\","
           "\"size\":%d,\"iters\":%ld,\"p50_us\":%.2f,\"p99_us\":%.2f,\"mptcp\":%s}\n",
           o.proto_name, o.size, o.iters, t[o.iters / 2], t[o.iters * 99 / 100], mp);
    fflush(stdout);
    free(t);
    free(b);
}

/* ---- probe of the zero-copy paths ---- */

struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static int ring_setup(struct ring *r)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    r->fd = (int)syscall(__NR_io_uring_setup, 4, &p);
    if (r->fd < 0)
        return -errno;
    size_t sl = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cl = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cl > sl)
        sl = cl;
    char *sq = mmap(NULL, sl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                    IORING_OFF_SQ_RING);
    char *cq = sq;
    if (sq == MAP_FAILED)
        return -errno;
    if (!(p.features & IORING_FEAT_SINGLE_MMAP)) {
        cq = mmap(NULL, cl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_CQ_RING);
        if (cq == MAP_FAILED)
            return -errno;
    }
    r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED)
        return -errno;
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

/* Waits for the next completion: its result, and its flags in *flags. */
static int ring_reap(struct ring *r, unsigned *flags)
{
    for (;;) {
        unsigned head = *r->cq_head;
        if (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
            struct io_uring_cqe *c = &r->cqes[head & *r->cq_mask];
            int res = c->res;
            *flags = c->flags;
            __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
            return res;
        }
        if (syscall(__NR_io_uring_enter, r->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 &&
            errno != EINTR)
            return -errno;
    }
}

/* One operation on fd over len bytes of b: "ok N" with its result, or the errno's name. For
 * send_zc, also whether the notification came. */
static void ring_op(struct ring *r, int op, int fd, char *b, unsigned len, char *res, size_t cap)
{
    unsigned tail = *r->sq_tail, i = tail & *r->sq_mask, flags = 0;
    struct io_uring_sqe *e = &r->sqes[i];
    memset(e, 0, sizeof *e);
    e->opcode = (uint8_t)op;
    e->fd = fd;
    e->addr = (uint64_t)(uintptr_t)b;
    e->len = len;
    e->msg_flags = op == IORING_OP_RECV ? 0 : MSG_NOSIGNAL;
    r->sq_array[i] = i;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, r->fd, 1, 0, 0, NULL, 0) < 0) {
        snprintf(res, cap, "\"%s\"", err_name(errno));
        return;
    }
    int n = ring_reap(r, &flags);
    if (n < 0) {
        snprintf(res, cap, "\"%s\"", err_name(-n));
        return;
    }
    int notif = 0;
    if (flags & IORING_CQE_F_MORE) {
        unsigned f2 = 0;
        ring_reap(r, &f2);
        notif = (f2 & IORING_CQE_F_NOTIF) != 0;
    }
    snprintf(res, cap, op == IORING_OP_SEND_ZC ? "\"ok %d, notification %s\"" : "\"ok %d\"", n,
             notif ? "yes" : "no");
}

static void probe_client(int fd)
{
    enum { LEN = 64 << 10 };
    static char b[LEN];
    char zc[64], mz[96], sp_out[64], sp_in[64], us[64], ur[64], uz[96];
    memset(b, 0x5a, sizeof b);
    int one = 1;
    int zc_on = setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) == 0;
    snprintf(zc, sizeof zc, "\"%s\"", zc_on ? "ok" : err_name(errno));
    /* MSG_ZEROCOPY: the send, then its completion on the error queue. */
    ssize_t r = send(fd, b, LEN, MSG_ZEROCOPY | MSG_NOSIGNAL);
    if (r < 0) {
        snprintf(mz, sizeof mz, "\"%s\"", err_name(errno));
    } else if (!zc_on) {
        snprintf(mz, sizeof mz, "\"sent %zd, flag ignored without SO_ZEROCOPY\"", r);
    } else {
        const char *what = "no completion in 1 s";
        for (int i = 0; i < 100; i++) {
            char ctrl[128];
            struct msghdr m;
            memset(&m, 0, sizeof m);
            m.msg_control = ctrl;
            m.msg_controllen = sizeof ctrl;
            if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0) {
                struct cmsghdr *c = CMSG_FIRSTHDR(&m);
                struct sock_extended_err *ee = c ? (struct sock_extended_err *)CMSG_DATA(c) : NULL;
                what = ee && ee->ee_origin == SO_EE_ORIGIN_ZEROCOPY
                    ? (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED ? "completion, copied"
                                                                 : "completion, not copied")
                    : "other error-queue message";
                break;
            }
            usleep(10000);
        }
        snprintf(mz, sizeof mz, "\"sent %zd, %s\"", r, what);
    }
    /* splice: a pipe into the socket, and the socket into a pipe. */
    int pp[2];
    if (pipe(pp) != 0)
        die("pipe");
    if (write(pp[1], b, 16384) != 16384)
        die("write");
    r = splice(pp[0], NULL, fd, NULL, 16384, 0);
    if (r < 0)
        snprintf(sp_out, sizeof sp_out, "\"%s\"", err_name(errno));
    else
        snprintf(sp_out, sizeof sp_out, "\"ok %zd\"", r);
    struct pollfd p = {fd, POLLIN, 0};
    poll(&p, 1, 2000);
    int pq[2];
    if (pipe(pq) != 0)
        die("pipe");
    r = splice(fd, NULL, pq[1], NULL, 4096, SPLICE_F_NONBLOCK);
    if (r < 0)
        snprintf(sp_in, sizeof sp_in, "\"%s\"", err_name(errno));
    else
        snprintf(sp_in, sizeof sp_in, "\"ok %zd\"", r);
    struct ring ring;
    int e = ring_setup(&ring);
    if (e < 0) {
        snprintf(us, sizeof us, "\"setup %s\"", err_name(-e));
        snprintf(ur, sizeof ur, "%s", us);
        snprintf(uz, sizeof uz, "%s", us);
    } else {
        ring_op(&ring, IORING_OP_SEND, fd, b, 4096, us, sizeof us);
        ring_op(&ring, IORING_OP_RECV, fd, b, 4096, ur, sizeof ur);
        ring_op(&ring, IORING_OP_SEND_ZC, fd, b, 4096, uz, sizeof uz);
    }
    printf("{\"bench\":\"link-floor\",\"mode\":\"probe\",\"side\":\"client\",\"proto\":\"%s\","
           "\"so_zerocopy\":%s,\"msg_zerocopy\":%s,\"splice_to_sock\":%s,"
           "\"splice_from_sock\":%s,\"uring_send\":%s,\"uring_recv\":%s,\"uring_send_zc\":%s}\n",
           o.proto_name, zc, mz, sp_out, sp_in, us, ur, uz);
    fflush(stdout);
    shutdown(fd, SHUT_WR);
    while (recv(fd, b, sizeof b, 0) > 0) {
    }
}

static void probe_server(int fd)
{
    enum { LEN = 256 << 10 };
    static char b[LEN];
    memset(b, 0x33, sizeof b);
    spin_send(fd, b, LEN);
    uint64_t got = 0;
    ssize_t r;
    while ((r = recv(fd, b, sizeof b, 0)) > 0)
        got += (uint64_t)r;
    printf("{\"bench\":\"link-floor\",\"mode\":\"probe\",\"side\":\"server\",\"proto\":\"%s\","
           "\"bytes_received\":%llu}\n",
           o.proto_name, (unsigned long long)got);
    fflush(stdout);
}

/* ---- the two sides ---- */

static int serve(void)
{
    struct sockaddr_in a = sin_of(o.bind ? o.bind : "0.0.0.0", o.port);
    int l = new_socket(), one = 1, rc = 0;
    if (setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4) != 0)
        die("listen");
    for (int c = 0; c < o.count; c++) {
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            die("accept");
        sock_opts(fd);
        struct hello h;
        if (!spin_recv(fd, (char *)&h, sizeof h) || h.magic != HELLO_MAGIC) {
            fprintf(stderr, "link-floor: no hello\n");
            return 1;
        }
        if (h.mode == MODE_PINGPONG) {
            pingpong_server(fd, h.size);
        } else if (h.mode == MODE_PROBE) {
            probe_server(fd);
        } else {
            struct stream s = {.to_recv = h.bytes, .to_send = h.both ? h.bytes : 0,
                               .seed_in = 1, .seed_out = 2};
            if (run_stream(fd, &s) != 0) {
                s.err_at_real = real_s();
                rc = 3;
            }
            stream_json(&s, fd, (int)h.both, ""); /* its recv line, after a send line */
        }
        close(fd);
    }
    return rc;
}

static int client(void)
{
    int fd = connect_retry();
    char ut[64] = "";
    if (o.user_timeout > 0) {
        unsigned v = (unsigned)o.user_timeout;
        int ok = setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof v) == 0;
        snprintf(ut, sizeof ut, "\"user_timeout\":\"%s\",", ok ? "ok" : err_name(errno));
    }
    struct hello h = {HELLO_MAGIC, (uint32_t)o.mode, o.bytes, (uint32_t)o.size,
                      (uint32_t)o.both};
    spin_send(fd, (const char *)&h, sizeof h);
    int rc = 0;
    if (o.mode == MODE_PINGPONG) {
        pingpong_client(fd);
    } else if (o.mode == MODE_PROBE) {
        probe_client(fd);
    } else {
        struct stream s = {.to_send = o.bytes, .to_recv = o.both ? o.bytes : 0,
                           .seed_out = 1, .seed_in = 2};
        if (run_stream(fd, &s) != 0) {
            s.err_at_real = real_s();
            rc = 3;
        }
        stream_json(&s, fd, 1, ut);
    }
    close(fd);
    return rc;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1 << 20; break;
    case 'G': case 'g': v *= 1 << 30; break;
    default: break;
    }
    return (uint64_t)v;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: link-floor server --proto tcp|mptcp [--bind ADDR] [--port P] [--count K]\n"
            "                         [--cpu C] [--idle-timeout S]\n"
            "       link-floor client --proto tcp|mptcp --mode stream|pingpong|probe --addr A\n"
            "                         [--port P] [--bytes N] [--both] [--rate MBPS] [--chunk N]\n"
            "                         [--user-timeout MS] [--deadline S] [--size S]\n"
            "                         [--iters N] [--cpu C] [--cc ALGO]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"proto", 1, 0, 'p'}, {"mode", 1, 0, 'm'}, {"addr", 1, 0, 'a'},
        {"bind", 1, 0, 'B'}, {"port", 1, 0, 'P'}, {"count", 1, 0, 'k'},
        {"bytes", 1, 0, 'n'}, {"both", 0, 0, 'b'}, {"rate", 1, 0, 'r'},
        {"chunk", 1, 0, 'c'}, {"user-timeout", 1, 0, 'u'}, {"deadline", 1, 0, 'd'},
        {"idle-timeout", 1, 0, 'i'}, {"size", 1, 0, 's'}, {"iters", 1, 0, 'I'},
        {"cpu", 1, 0, 'C'}, {"cc", 1, 0, 'g'}, {0, 0, 0, 0},
    };
    if (argc < 2)
        usage();
    if (strcmp(argv[1], "server") == 0)
        o.server = 1;
    else if (strcmp(argv[1], "client") != 0)
        usage();
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'p': o.proto_name = optarg; break;
        case 'm':
            o.mode = !strcmp(optarg, "stream") ? MODE_STREAM
                : !strcmp(optarg, "pingpong") ? MODE_PINGPONG
                : !strcmp(optarg, "probe") ? MODE_PROBE : 0;
            break;
        case 'a': o.addr = optarg; break;
        case 'B': o.bind = optarg; break;
        case 'P': o.port = atoi(optarg); break;
        case 'k': o.count = atoi(optarg); break;
        case 'n': o.bytes = parse_size(optarg); break;
        case 'b': o.both = 1; break;
        case 'r': o.rate = atof(optarg); break;
        case 'c': o.chunk = (size_t)parse_size(optarg); break;
        case 'u': o.user_timeout = atoi(optarg); break;
        case 'd': o.deadline = atof(optarg); break;
        case 'i': o.idle = atof(optarg); break;
        case 's': o.size = (int)parse_size(optarg); break;
        case 'I': o.iters = atol(optarg); break;
        case 'C': o.cpu = atoi(optarg); break;
        case 'g': o.cc = optarg; break;
        default: usage();
        }
    }
    if (optind != argc || !o.proto_name)
        usage();
    if (!strcmp(o.proto_name, "tcp"))
        o.proto = 0;
    else if (!strcmp(o.proto_name, "mptcp"))
        o.proto = IPPROTO_MPTCP;
    else
        usage();
    if (!o.server && (!o.addr || !o.mode))
        usage();
    if (o.size < 1 || o.iters < 1 || o.chunk < 1 || o.count < 1 || o.bytes < 1)
        usage();
    if (o.cpu >= 0)
        pin(o.cpu);
    return o.server ? serve() : client();
}
