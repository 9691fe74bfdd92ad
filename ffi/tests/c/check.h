/*
 * The C test programs' check (on failure, says where, what, and the library's last error,
 * and exits 1) and clock. Include after defining _POSIX_C_SOURCE.
 */
#ifndef RINGBTL_TEST_CHECK_H
#define RINGBTL_TEST_CHECK_H

#include "ringbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, " (last error: %s)\n", ringbtl_last_error());                  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* Monotonic seconds, for the programs' deadlines. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
