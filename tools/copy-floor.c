/*
 * copy-floor: which copies bound a plain-socket stream of large messages on loopback,
 * measured interleaved. Every round streams MESSAGES messages of SIZE bytes in each of
 * four ways, each over a connection of its own between the same two processes (sender
 * pinned to CPU 0, receiver to CPU 1, congestion control CC); the receiver answers one
 * byte after the last message, and the sender's time from its first call to that byte
 * gives the way's MB/s for the round. Both buffers are reused by every message.
 *
 *   copy2    send() from the buffer, recv() into the buffer: a copy on each side
 *            (Open MPI's btl tcp; ringbtl's copied payloads)
 *   lend     vmsplice() of the buffer into a pipe, splice() to the socket, recv(): the
 *            receiver's copy only (ringbtl's lent payloads)
 *   map      write() into a pipe, splice() to the socket, TCP_ZEROCOPY_RECEIVE maps the
 *            received pages into the receiver: the sender's copy only
 *   lendmap  the lend sender and the map receiver: no copy, if the kernel maps the pages
 *
 * The receiver of map and lendmap copies with recv() whatever the kernel does not map
 * (recv_skip_hint); "mapped_*" is the mapped fraction of the bytes. The kernel maps only
 * whole, non-compound pages with no owner (can_map_frag() in net/ipv4/tcp.c, Linux 6.8 and
 * later): a pipe's own pages, but neither a user's pages nor TCP's own page fragments.
 *
 * Usage: copy-floor [CC [SIZE [ROUNDS [MESSAGES]]]]   (defaults reno 4194304 7 100)
 * Prints: {"bench":"copy-floor","cc":CC,"size":SIZE,"mbs_copy2":..,"mbs_lend":..,
 *          "mbs_map":..,"mbs_lendmap":..,"mapped_map":..,"mapped_lendmap":..,
 *          "ratio_lend":..,"ratio_map":..,"ratio_lendmap":..}
 *          (medians of the rounds; ratio = the way's MB/s / copy2's)
 * Build: cc -O2 -o copy-floor copy-floor.c   (with spin.h beside it)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spin.h"

enum { COPY2, LEND, MAP, LENDMAP, WAYS };
static const char *const NAMES[WAYS] = {"copy2", "lend", "map", "lendmap"};
/* The pipe between a splicing sender's buffer and its socket. */
#define PIPE_BYTES (1 << 20)
#define PAGE 4096

static int lends(int way) { return way == LEND || way == LENDMAP; }
static int maps(int way) { return way == MAP || way == LENDMAP; }

/* Moves n bytes from the pipe to the socket, spinning on a full socket. */
static void drain_pipe(int pipe_rd, int fd, size_t n)
{
    while (n > 0) {
        ssize_t r = splice(pipe_rd, NULL, fd, NULL, n, SPLICE_F_MORE | SPLICE_F_NONBLOCK);
        if (r > 0)
            n -= (size_t)r;
        else if (r < 0 && errno != EAGAIN && errno != EINTR)
            die("splice");
    }
}

/* Sends one message of len bytes from buf the way `way` does. */
static void send_message(int way, int fd, const int *pipe_fds, char *buf, size_t len)
{
    if (way == COPY2) {
        spin_send(fd, buf, len);
        return;
    }
    size_t off = 0;
    while (off < len) {
        size_t n = len - off < PIPE_BYTES ? len - off : PIPE_BYTES;
        ssize_t r;
        if (lends(way)) {
            struct iovec v = {buf + off, n};
            r = vmsplice(pipe_fds[1], &v, 1, 0);
        } else {
            r = write(pipe_fds[1], buf + off, n);
        }
        if (r <= 0)
            die(lends(way) ? "vmsplice" : "write to pipe");
        drain_pipe(pipe_fds[0], fd, (size_t)r);
        off += (size_t)r;
    }
}

/* Receives total bytes the way `way` does: mapped through `map` where the kernel can,
 * copied into buf elsewhere. Returns the bytes mapped. */
static size_t receive_stream(int way, int fd, char *map, char *buf, size_t len, size_t total)
{
    size_t mapped = 0;
    if (!maps(way)) {
        for (size_t got = 0; got < total; got += len)
            recv_all(fd, buf, len);
        return 0;
    }
    size_t got = 0;
    while (got < total) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0)
            continue;
        size_t left = total - got;
        struct tcp_zerocopy_receive zc;
        memset(&zc, 0, sizeof zc);
        zc.address = (unsigned long)map;
        zc.length = (unsigned)((left < len ? left : len) / PAGE * PAGE);
        socklen_t zl = sizeof zc;
        if (zc.length > 0) {
            if (getsockopt(fd, IPPROTO_TCP, TCP_ZEROCOPY_RECEIVE, &zc, &zl) != 0)
                die("TCP_ZEROCOPY_RECEIVE");
            got += zc.length;
            mapped += zc.length;
            left -= zc.length;
        } else {
            zc.recv_skip_hint = (unsigned)left;
        }
        if (zc.recv_skip_hint > 0 && left > 0) {
            /* Into the place a copying receiver would put these bytes. */
            size_t at = got % len, want = zc.recv_skip_hint < left ? zc.recv_skip_hint : left;
            if (want > len - at)
                want = len - at;
            ssize_t r = recv(fd, buf + at, want, MSG_DONTWAIT);
            if (r > 0) {
                got += (size_t)r;
            } else if (r == 0) {
                fprintf(stderr, "recv: end of stream\n");
                exit(1);
            } else if (errno != EAGAIN && errno != EINTR) {
                die("recv");
            }
        }
    }
    return mapped;
}

static double median(double *v, long n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    const char *cc = argc > 1 ? argv[1] : "reno";
    long size = argc > 2 ? atol(argv[2]) : 4L << 20;
    long rounds = argc > 3 ? atol(argv[3]) : 7;
    long messages = argc > 4 ? atol(argv[4]) : 100;
    if (size < PAGE || size > (256L << 20) || size % PAGE || rounds < 1 || rounds > 1000 ||
        messages < 1) {
        fprintf(stderr, "usage: copy-floor [CC [SIZE (pages, up to 256 MiB) [ROUNDS (1..1000) "
                        "[MESSAGES]]]]\n");
        return 2;
    }
    size_t len = (size_t)size, total = len * (size_t)messages;
    char *buf = aligned_alloc(PAGE, len);
    if (!buf)
        die("aligned_alloc");
    memset(buf, 0x5a, len);
    struct sockaddr_in a;
    int l = listen_loopback(&a, WAYS);
    int fds[WAYS];
    char ack = 1;
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        pin(1);
        char *maps_at[WAYS] = {0};
        for (int w = 0; w < WAYS; w++) {
            fds[w] = accept(l, NULL, NULL);
            if (fds[w] < 0)
                die("accept");
            nodelay_cc(fds[w], cc);
            if (maps(w)) {
                maps_at[w] = mmap(NULL, len, PROT_READ, MAP_SHARED, fds[w], 0);
                if (maps_at[w] == MAP_FAILED)
                    die("mmap of the socket");
            }
        }
        size_t mapped[WAYS] = {0};
        for (long r = 0; r < rounds; r++) {
            for (int w = 0; w < WAYS; w++) {
                mapped[w] += receive_stream(w, fds[w], maps_at[w], buf, len, total);
                spin_send(fds[w], &ack, 1);
            }
        }
        /* The mapped fractions go back to the sender, which prints. */
        for (int w = 0; w < WAYS; w++)
            spin_send(fds[0], (const char *)&mapped[w], sizeof mapped[w]);
        return 0;
    }
    pin(0);
    int pipes[WAYS][2];
    for (int w = 0; w < WAYS; w++) {
        fds[w] = connect_cc(&a, cc);
        pipes[w][0] = pipes[w][1] = -1;
        if (w != COPY2) {
            if (pipe(pipes[w]) != 0)
                die("pipe");
            if (fcntl(pipes[w][1], F_SETPIPE_SZ, PIPE_BYTES) < PIPE_BYTES)
                die("F_SETPIPE_SZ (fs.pipe-max-size below 1 MiB?)");
        }
    }
    double *mbs[WAYS];
    for (int w = 0; w < WAYS; w++)
        if (!(mbs[w] = malloc(sizeof(double) * (size_t)rounds)))
            die("malloc");
    for (long r = 0; r < rounds; r++) {
        for (int w = 0; w < WAYS; w++) {
            double t0 = now_us();
            for (long m = 0; m < messages; m++)
                send_message(w, fds[w], pipes[w], buf, len);
            char got;
            recv_all(fds[w], &got, 1);
            mbs[w][r] = (double)total / (now_us() - t0);
        }
    }
    size_t mapped[WAYS];
    for (int w = 0; w < WAYS; w++)
        recv_all(fds[0], (char *)&mapped[w], sizeof mapped[w]);
    double med[WAYS];
    for (int w = 0; w < WAYS; w++)
        med[w] = median(mbs[w], rounds);
    double all = (double)total * (double)rounds;
    printf("{\"bench\":\"copy-floor\",\"cc\":\"%s\",\"size\":%ld", cc, size);
    for (int w = 0; w < WAYS; w++)
        printf(",\"mbs_%s\":%.0f", NAMES[w], med[w]);
    printf(",\"mapped_map\":%.3f,\"mapped_lendmap\":%.3f", (double)mapped[MAP] / all,
           (double)mapped[LENDMAP] / all);
    for (int w = 1; w < WAYS; w++)
        printf(",\"ratio_%s\":%.3f", NAMES[w], med[w] / med[COPY2]);
    printf("}\n");
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
