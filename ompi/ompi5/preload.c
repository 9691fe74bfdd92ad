/*
 * For an Open MPI 5 built with --disable-dlopen (the PyPI wheel): its components are
 * linked into libopen-pal, mca_base_component_path is ignored, and the BTL framework
 * opens the components listed in the exported array mca_btl_base_static_components.
 * Preloaded (mpirun -x LD_PRELOAD=.../libringbtl_preload.so), this library's definition of
 * that array takes precedence over libopen-pal's, and lists ringbtl beside the BTLs that
 * run on one host (self, sm, tcp). A distribution's Open MPI 5 loads mca_btl_ringbtl.so
 * from mca_base_component_path like 4.1 and needs none of this.
 */
#include <stddef.h>

struct mca_base_component_2_1_0_t;
typedef struct mca_base_component_2_1_0_t mca_base_component_t;

extern const mca_base_component_t mca_btl_self_component;
extern const mca_base_component_t mca_btl_sm_component;
extern const mca_base_component_t mca_btl_tcp_component;
extern const mca_base_component_t mca_btl_ringbtl_component;

__attribute__((visibility("default"))) const mca_base_component_t
    *mca_btl_base_static_components[] = {&mca_btl_self_component, &mca_btl_sm_component,
                                         &mca_btl_tcp_component, &mca_btl_ringbtl_component,
                                         NULL};
