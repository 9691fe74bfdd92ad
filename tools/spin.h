/*
 * spin.h: the plain-socket loops of tools/floor.c, tools/rate-floor.c, tools/stripe-floor.c
 * and tools/copy-floor.c, the floors that ringbtl is measured against: a TCP_NODELAY
 * socket whose non-blocking send and recv are spun until the whole message has moved (no
 * poll, no wait in the kernel); the loopback listener and socket options they share; their
 * clock and the order of their samples; and, for a program that defines _GNU_SOURCE,
 * pinning to a CPU.
 */
#ifndef RINGBTL_TOOLS_SPIN_H
#define RINGBTL_TOOLS_SPIN_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static inline void die(const char *what)
{
    perror(what);
    exit(1);
}

static inline void nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        die("TCP_NODELAY");
}

/* TCP_NODELAY and the congestion control cc (TCP_CONGESTION: reno, bbr, ...). */
static inline void nodelay_cc(int fd, const char *cc)
{
    nodelay(fd);
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc)) != 0)
        die("TCP_CONGESTION");
}

/* A socket listening on an ephemeral loopback port with a backlog of n; *a is its address. */
static inline int listen_loopback(struct sockaddr_in *a, int n)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t al = sizeof *a;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l < 0 || bind(l, (struct sockaddr *)a, sizeof *a) != 0 || listen(l, n) != 0 ||
        getsockname(l, (struct sockaddr *)a, &al) != 0)
        die("listen");
    return l;
}

/* A socket connected to *a, set up by nodelay_cc. */
static inline int connect_cc(const struct sockaddr_in *a, const char *cc)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket");
    nodelay_cc(fd, cc);
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) != 0)
        die("connect");
    return fd;
}

/* Sends all n bytes, spinning on a full socket. */
static inline void spin_send(int fd, const char *b, size_t n)
{
    while (n > 0) {
        ssize_t r = send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
        } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
            die("send");
        }
    }
}

/* Receives all n bytes, spinning on an empty socket. Returns 0 at end of stream before
 * the first byte; exits at end of stream after it. */
static inline int spin_recv(int fd, char *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, b + got, n - got, MSG_DONTWAIT);
        if (r > 0) {
            got += (size_t)r;
        } else if (r == 0) {
            if (got == 0)
                return 0;
            fprintf(stderr, "peer closed mid-message\n");
            exit(1);
        } else if (errno != EAGAIN && errno != EINTR) {
            die("recv");
        }
    }
    return 1;
}

/* Microseconds on the monotonic clock. */
static inline double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* qsort's order of doubles, ascending. */
static inline int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Receives all n bytes, spinning; the end of the stream is an error (exits). */
static inline void recv_all(int fd, char *b, size_t n)
{
    if (!spin_recv(fd, b, n)) {
        fprintf(stderr, "recv: end of stream\n");
        exit(1);
    }
}

#ifdef _GNU_SOURCE
#include <sched.h>

/* Runs the calling process on CPU cpu only (rank 0 on CPU 0, rank 1 on CPU 1). */
static inline void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0)
        die("sched_setaffinity");
}
#endif

#endif
