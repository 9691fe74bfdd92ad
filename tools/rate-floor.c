/*
 * rate-floor: the coalesced floor of a small-message rate test on this machine, what no
 * messaging library can beat with osu_mbw_mr's pattern: windows of W frames of F bytes (a
 * frame: ringbtl's 8-byte header and the payload) written with ONE send per window (the
 * perfect coalescing), read by the other process with non-blocking recv spun until the
 * whole window is in, then a 4-byte acknowledgement; TCP_NODELAY, loopback, the two
 * processes pinned to CPU 0 and CPU 1 (as `ringbtl-bench rate --pin`).
 *
 * Usage: rate-floor [WINDOW [FRAME_BYTES [WINDOWS]]]   (defaults 64, 16, 20000)
 * Prints: {"bench":"rate-floor","window":W,"frame":F,"msg_s":R,"us_per_window":T}
 * Build: cc -O2 -o rate-floor rate-floor.c   (with spin.h beside it)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spin.h"

int main(int argc, char **argv)
{
    long window = argc > 1 ? atol(argv[1]) : 64;
    long frame = argc > 2 ? atol(argv[2]) : 16;
    long windows = argc > 3 ? atol(argv[3]) : 20000;
    long warm = windows / 10 + 1;
    if (window < 1 || frame < 1 || windows < 1 || window * frame > (64L << 20)) {
        fprintf(stderr, "usage: rate-floor [WINDOW [FRAME_BYTES [WINDOWS]]]\n");
        return 2;
    }
    size_t bytes = (size_t)(window * frame);
    char *buf = calloc(bytes, 1);
    char ack[4] = {0};
    if (!buf)
        die("calloc");
    struct sockaddr_in a;
    int l = listen_loopback(&a, 1);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        pin(1);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
            die("connect");
        nodelay(c);
        for (long i = 0; i < warm + windows; i++) {
            recv_all(c, buf, bytes);
            spin_send(c, ack, sizeof ack);
        }
        return 0;
    }
    pin(0);
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    nodelay(s);
    for (long i = 0; i < warm; i++) {
        spin_send(s, buf, bytes);
        recv_all(s, ack, sizeof ack);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < windows; i++) {
        spin_send(s, buf, bytes);
        recv_all(s, ack, sizeof ack);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("{\"bench\":\"rate-floor\",\"window\":%ld,\"frame\":%ld,\"msg_s\":%.0f,"
           "\"us_per_window\":%.3f}\n",
           window, frame, (double)(windows * window) / secs, secs / (double)windows * 1e6);
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
