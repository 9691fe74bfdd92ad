/*
 * stripe-floor: what cutting a large message over several TCP connections does to a
 * plain-socket ping-pong, measured interleaved: one connection and N connections between
 * the same two processes, in alternating rounds, each message of SIZE bytes cut into N
 * equal parts sent at once, one per connection (non-blocking send and recv spun over the
 * connections in turn), the reply the same way. Both series meet the same speed of the
 * machine (which changes every few seconds here), so their ratio holds from run to run.
 * Loopback, the two processes pinned to CPU 0 and CPU 1, TCP_NODELAY, every connection
 * under the congestion control CC (TCP_CONGESTION: reno, bbr, ...).
 * It is the plain-socket floor of one peer over several links (an endpoint striping a
 * message over N connections): what striping can gain, or cost, before any transport work.
 *
 * Usage: stripe-floor [N [CC [SIZE [ROUNDS [PER_ROUND]]]]]   (defaults 2 bbr 1048576 20 50)
 * Prints: {"bench":"stripe-floor","cc":CC,"size":SIZE,"conns":N,"p50_us_1":..,"p50_us_n":..,
 *          "ratio_p50":..}   (one-way = round trip / 2; ratio = N connections / one)
 * Build: cc -O2 -o stripe-floor stripe-floor.c   (with spin.h beside it)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spin.h"

#define MAX_CONNS 8
/* Unmeasured round trips at the start of every round. */
#define ROUND_WARMUP 5

/* Part i of a message of len bytes cut into n: its offset and length. */
static void part(size_t len, int n, int i, size_t *off, size_t *plen)
{
    size_t each = len / (size_t)n;
    *off = each * (size_t)i;
    *plen = i == n - 1 ? len - each * (size_t)(n - 1) : each;
}

/* Moves the message over the n connections at once: sends (or receives) the parts, one
 * call per connection in turn, until every part has moved. */
static void move(const int *fds, int n, char *buf, size_t len, int sending)
{
    size_t done[MAX_CONNS] = {0};
    int left = n;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            size_t off, plen;
            part(len, n, i, &off, &plen);
            if (done[i] == plen)
                continue;
            ssize_t r = sending
                ? send(fds[i], buf + off + done[i], plen - done[i], MSG_DONTWAIT | MSG_NOSIGNAL)
                : recv(fds[i], buf + off + done[i], plen - done[i], MSG_DONTWAIT);
            if (r > 0) {
                done[i] += (size_t)r;
                if (done[i] == plen)
                    left--;
            } else if (r == 0 && !sending) {
                fprintf(stderr, "stripe-floor: end of stream\n");
                exit(1);
            } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
                die(sending ? "send" : "recv");
            }
        }
    }
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    const char *cc = argc > 2 ? argv[2] : "bbr";
    long size = argc > 3 ? atol(argv[3]) : 1L << 20;
    long rounds = argc > 4 ? atol(argv[4]) : 20;
    long per = argc > 5 ? atol(argv[5]) : 50;
    if (n < 1 || n > MAX_CONNS || size < n || size > (256L << 20) || rounds < 1 || per < 1) {
        fprintf(stderr, "usage: stripe-floor [N (1..%d) [CC [SIZE [ROUNDS [PER_ROUND]]]]]\n",
                MAX_CONNS);
        return 2;
    }
    size_t len = (size_t)size;
    char *buf = malloc(len);
    double *t1 = malloc(sizeof(double) * (size_t)(rounds * per));
    double *tn = malloc(sizeof(double) * (size_t)(rounds * per));
    if (!buf || !t1 || !tn)
        die("malloc");
    memset(buf, 0x5a, len);
    struct sockaddr_in a;
    int l = listen_loopback(&a, MAX_CONNS + 1);
    /* fds[0]: the one-connection series; fds[1..=n]: the n connections. */
    int fds[MAX_CONNS + 1];
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        pin(1);
        for (int i = 0; i <= n; i++) {
            fds[i] = accept(l, NULL, NULL);
            if (fds[i] < 0)
                die("accept");
            nodelay_cc(fds[i], cc);
        }
        for (long r = 0; r < rounds; r++) {
            for (int series = 0; series < 2; series++) {
                const int *set = series == 0 ? fds : fds + 1;
                int k = series == 0 ? 1 : n;
                for (long i = 0; i < ROUND_WARMUP + per; i++) {
                    move(set, k, buf, len, 0);
                    move(set, k, buf, len, 1);
                }
            }
        }
        return 0;
    }
    pin(0);
    for (int i = 0; i <= n; i++) {
        fds[i] = connect_cc(&a, cc);
    }
    long got1 = 0, gotn = 0;
    for (long r = 0; r < rounds; r++) {
        for (int series = 0; series < 2; series++) {
            const int *set = series == 0 ? fds : fds + 1;
            int k = series == 0 ? 1 : n;
            for (long i = 0; i < ROUND_WARMUP + per; i++) {
                double t0 = now_us();
                move(set, k, buf, len, 1);
                move(set, k, buf, len, 0);
                double one_way = (now_us() - t0) / 2;
                if (i >= ROUND_WARMUP) {
                    if (series == 0)
                        t1[got1++] = one_way;
                    else
                        tn[gotn++] = one_way;
                }
            }
        }
    }
    qsort(t1, (size_t)got1, sizeof *t1, by_value);
    qsort(tn, (size_t)gotn, sizeof *tn, by_value);
    double p1 = t1[got1 / 2], pn = tn[gotn / 2];
    printf("{\"bench\":\"stripe-floor\",\"cc\":\"%s\",\"size\":%ld,\"conns\":%d,"
           "\"p50_us_1\":%.2f,\"p50_us_n\":%.2f,\"ratio_p50\":%.3f}\n",
           cc, size, n, p1, pn, pn / p1);
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
