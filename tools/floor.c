/*
 * floor: the busy-poll floor of a TCP ping-pong, a plain non-blocking socket whose send
 * and recv are spun until the whole message has moved (as `ringbtl-bench latency
 * --baseline` in poll mode), usable between network namespaces, where the benchmark's own
 * baseline (loopback only) is not. TCP_NODELAY; the congestion control is the network
 * namespace's default (net.ipv4.tcp_congestion_control).
 *
 * Usage: floor server PORT                  (serves one client, then exits)
 *        floor client HOST PORT SIZE[,SIZE...] [ITERS]
 * The client prints one JSON object per size:
 *   {"bench":"latency","size":N,"iters":I,"avg_us":A,"p50_us":P}  (one-way = round trip / 2)
 * Build: cc -O2 -o floor floor.c   (with spin.h beside it)
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "spin.h"

#define MAX_SIZE (4 << 20)

int main(int argc, char **argv)
{
    static char buf[MAX_SIZE];
    if (argc == 3 && !strcmp(argv[1], "server")) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0)
            die("listen");
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            die("accept");
        nodelay(fd);
        /* Each message starts with its size (4 bytes, once per size change). */
        uint32_t size;
        while (spin_recv(fd, (char *)&size, 4)) {
            if (size == 0 || size > MAX_SIZE)
                break;
            for (;;) {
                if (!spin_recv(fd, buf, size))
                    return 0;
                if (buf[0] == 'E')
                    break;
                spin_send(fd, buf, size);
            }
        }
        return 0;
    }
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "client")) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
        if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
            die("address");
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
            die("connect");
        nodelay(fd);
        int iters_arg = argc == 6 ? atoi(argv[5]) : 0;
        for (char *tok = strtok(argv[4], ","); tok; tok = strtok(NULL, ",")) {
            long v = strtol(tok, NULL, 10);
            uint32_t size = (uint32_t)(v < 1 ? 1 : v);
            if (size > MAX_SIZE)
                size = MAX_SIZE;
            int iters = iters_arg > 0 ? iters_arg : (size <= 8192 ? 10000 : 1000);
            int skip = iters / 10 + 1;
            double *rt = malloc(sizeof(double) * (size_t)iters);
            if (!rt)
                die("malloc");
            spin_send(fd, (char *)&size, 4);
            memset(buf, 'x', size);
            double t0 = 0;
            for (int i = 0; i < iters + skip; i++) {
                if (i == skip)
                    t0 = now_us();
                double s = now_us();
                spin_send(fd, buf, size);
                if (!spin_recv(fd, buf, size)) {
                    fprintf(stderr, "floor: server closed\n");
                    return 1;
                }
                if (i >= skip)
                    rt[i - skip] = now_us() - s;
            }
            double avg = (now_us() - t0) / (2.0 * iters);
            buf[0] = 'E';
            spin_send(fd, buf, size);
            qsort(rt, (size_t)iters, sizeof(double), by_value);
            printf("{\"bench\":\"latency\",\"size\":%u,\"iters\":%d,\"avg_us\":%.3f,"
                   "\"p50_us\":%.3f}\n",
                   size, iters, avg, rt[iters / 2] / 2.0);
            fflush(stdout);
            free(rt);
        }
        return 0;
    }
    fprintf(stderr, "usage: floor server PORT | floor client HOST PORT SIZE[,SIZE...] [ITERS]\n");
    return 2;
}
