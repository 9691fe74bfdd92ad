/*
 * The C test programs' check: on failure, says where, what, and the library's last error,
 * and exits 1.
 */
#ifndef RINGBTL_TEST_CHECK_H
#define RINGBTL_TEST_CHECK_H

#include "ringbtl.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, " (last error: %s)\n", ringbtl_last_error());                  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#endif
