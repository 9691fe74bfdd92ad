/*
 * ack-floor: what the receiver's ACKs do to a plain-socket ping-pong of a large message
 * under a pacing congestion control (BBR), measured interleaved: three series between the
 * same two processes, each on a connection of its own, in alternating rounds:
 *   plain   one send of the whole message (non-blocking, spun), the reply the same way;
 *   quick   the same, and after each send the sender sets TCP_QUICKACK, so that the first
 *           segment of the answer is acknowledged as it arrives (a socket that answers soon
 *           after receiving is otherwise in the kernel's "pingpong" mode, whose ACKs wait
 *           to ride on its next data);
 *   rndv    a rendezvous, as Open MPI's ob1 does for large messages: the first 64 KiB, a
 *           4-byte answer, then the rest (the answer acknowledges the first part at once).
 * BBR estimates the bandwidth from how fast its data is acknowledged; a first segment
 * acknowledged at once gives it a sample of the path's speed. `ss -tin` during the plain
 * series shows the estimate it keeps otherwise. Both series of a round meet the same speed
 * of the machine (which changes every few seconds here), so their ratios hold from run to
 * run. Loopback, the two processes pinned to CPU 0 and CPU 1, TCP_NODELAY, every
 * connection under the congestion control CC (TCP_CONGESTION: reno, bbr, ...).
 *
 * Usage: ack-floor [CC [SIZE [ROUNDS [PER_ROUND]]]]   (defaults bbr 1048576 10 40)
 * Prints: {"bench":"ack-floor","cc":CC,"size":SIZE,"p50_us_plain":..,"p50_us_quick":..,
 *          "p50_us_rndv":..,"ratio_quick":..,"ratio_rndv":..}
 *          (one-way = round trip / 2; ratio = that series / plain)
 * Build: cc -O2 -o ack-floor ack-floor.c   (with spin.h beside it)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spin.h"

enum { PLAIN, QUICK, RNDV, SERIES };
/* The rendezvous' first part. */
#define FIRST (64 * 1024)
/* Unmeasured round trips at the start of every round. */
#define ROUND_WARMUP 5

static void quick_ack(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one) != 0)
        die("TCP_QUICKACK");
}

/* Sends one message of the series. */
static void send_msg(int series, int fd, char *buf, size_t len)
{
    char answer[4];
    switch (series) {
    case RNDV:
        spin_send(fd, buf, FIRST);
        recv_all(fd, answer, sizeof answer);
        spin_send(fd, buf + FIRST, len - FIRST);
        break;
    case QUICK:
        spin_send(fd, buf, len);
        quick_ack(fd);
        break;
    default:
        spin_send(fd, buf, len);
    }
}

/* Receives one message of the series. */
static void recv_msg(int series, int fd, char *buf, size_t len)
{
    char answer[4] = {0};
    if (series == RNDV) {
        recv_all(fd, buf, FIRST);
        spin_send(fd, answer, sizeof answer);
        recv_all(fd, buf + FIRST, len - FIRST);
    } else {
        recv_all(fd, buf, len);
    }
}

int main(int argc, char **argv)
{
    const char *cc = argc > 1 ? argv[1] : "bbr";
    long size = argc > 2 ? atol(argv[2]) : 1L << 20;
    long rounds = argc > 3 ? atol(argv[3]) : 10;
    long per = argc > 4 ? atol(argv[4]) : 40;
    if (size <= FIRST || size > (256L << 20) || rounds < 1 || per < 1) {
        fprintf(stderr, "usage: ack-floor [CC [SIZE (> %d) [ROUNDS [PER_ROUND]]]]\n", FIRST);
        return 2;
    }
    size_t len = (size_t)size;
    char *buf = malloc(len);
    double *t[SERIES];
    long got[SERIES] = {0};
    if (!buf)
        die("malloc");
    for (int s = 0; s < SERIES; s++)
        if (!(t[s] = malloc(sizeof(double) * (size_t)(rounds * per))))
            die("malloc");
    memset(buf, 0x5a, len);
    struct sockaddr_in a;
    int l = listen_loopback(&a, SERIES);
    int fds[SERIES];
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        pin(1);
        for (int s = 0; s < SERIES; s++) {
            if ((fds[s] = accept(l, NULL, NULL)) < 0)
                die("accept");
            nodelay_cc(fds[s], cc);
        }
        for (long r = 0; r < rounds; r++)
            for (int s = 0; s < SERIES; s++)
                for (long i = 0; i < ROUND_WARMUP + per; i++) {
                    recv_msg(s, fds[s], buf, len);
                    send_msg(s, fds[s], buf, len);
                }
        return 0;
    }
    pin(0);
    for (int s = 0; s < SERIES; s++)
        fds[s] = connect_cc(&a, cc);
    for (long r = 0; r < rounds; r++)
        for (int s = 0; s < SERIES; s++)
            for (long i = 0; i < ROUND_WARMUP + per; i++) {
                double t0 = now_us();
                send_msg(s, fds[s], buf, len);
                recv_msg(s, fds[s], buf, len);
                if (i >= ROUND_WARMUP)
                    t[s][got[s]++] = (now_us() - t0) / 2;
            }
    double p50[SERIES];
    for (int s = 0; s < SERIES; s++) {
        qsort(t[s], (size_t)got[s], sizeof(double), by_value);
        p50[s] = t[s][got[s] / 2];
    }
    printf("{\"bench\":\"ack-floor\",\"cc\":\"%s\",\"size\":%ld,\"p50_us_plain\":%.2f,"
           "\"p50_us_quick\":%.2f,\"p50_us_rndv\":%.2f,\"ratio_quick\":%.3f,"
           "\"ratio_rndv\":%.3f}\n",
           cc, size, p50[PLAIN], p50[QUICK], p50[RNDV], p50[QUICK] / p50[PLAIN],
           p50[RNDV] / p50[PLAIN]);
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
