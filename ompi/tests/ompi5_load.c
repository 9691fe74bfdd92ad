/*
 * Loads the Open MPI 5.0 build of the component the way Open MPI's BTL framework does
 * (register its parameters, open it, ask it for modules) against whatever libopen-pal.so.80
 * and libpmix.so.2 are loaded first: tools/ompi5-layout.sh's stand-ins, each with one
 * layout that differs from Open MPI 5.0.x's. Prints "accepted" or "declined"; the
 * component must never crash.
 *
 * Usage: ompi5_load STANDIN_OPAL STANDIN_PMIX mca_btl_ringbtl.so
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>

#include "ompi5/opal5.h"

int main(int argc, char **argv)
{
    if (4 != argc) {
        fprintf(stderr, "usage: %s STANDIN_OPAL STANDIN_PMIX COMPONENT\n", argv[0]);
        return 2;
    }
    /* Global, as libmpi's own dependencies are. */
    for (int i = 1; i <= 2; i++) {
        if (NULL == dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL)) {
            fprintf(stderr, "ompi5_load: %s\n", dlerror());
            return 2;
        }
    }
    void *so = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
    if (NULL == so) {
        fprintf(stderr, "ompi5_load: %s\n", dlerror());
        return 2;
    }
    mca_btl_base_component_t *c = dlsym(so, "mca_btl_ringbtl_component");
    if (NULL == c) {
        fprintf(stderr, "ompi5_load: no mca_btl_ringbtl_component\n");
        return 2;
    }
    const int reg = c->btl_version.mca_register_component_params();
    const int open = c->btl_version.mca_open_component();
    int n = -1;
    mca_btl_base_module_t **modules = NULL;
    if (0 == reg && 0 == open) {
        printf("ompi5_load: register %d, open %d\naccepted\n", reg, open);
        return 0;
    }
    modules = c->btl_init(&n, false, false);
    const bool declined = 0 != reg && 0 != open && NULL == modules && 0 == n;
    printf("ompi5_load: register %d, open %d, init %s, %d modules\n%s\n", reg, open,
           NULL == modules ? "NULL" : "modules", n, declined ? "declined" : "INCONSISTENT");
    return declined ? 0 : 1;
}
