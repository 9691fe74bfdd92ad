/*
 * What differs between the two Open MPI series the component is built for, and nothing
 * else: Open MPI 4.1 (BTL interface 3.1, its installed headers) and Open MPI 5.0 (BTL
 * interface 3.3, RINGBTL_OMPI5, declared in ompi5/opal5.h). The rest of the component is
 * the same source for both.
 *
 * - the receive callback: 3.1 takes (btl, tag, descriptor, cbdata), 3.3 one receive
 *   descriptor (endpoint, segments, tag, cbdata): ringbtl_compat_deliver;
 * - the modex: 4.1's OPAL_MODEX_* macros, 5.0's PMIx calls (PMIx_Put, PMIx_Commit,
 *   PMIx_Get with the process's namespace and rank), as Open MPI 5 does itself;
 * - the fragment pools: 4.1's opal_free_list; 5.0's inline free-list code is not
 *   declared here (it depends on atomics and layouts the build cannot see), so the pools
 *   are ours (constructed as Open MPI objects of the same classes);
 * - in-place sends from a contiguous convertor (4.1 only: 5.0's convertor is opaque here,
 *   so the data is packed into the fragment);
 * - the flush before Open MPI blocks in PMIx (4.1's opal_pmix table; 5.0 calls PMIx
 *   directly, there is no table to wrap);
 * - the checks at load time: the series (both), and in 5.0 the sizes of what the
 *   component shares with the library (ringbtl_compat_check).
 */
#ifndef MCA_BTL_RINGBTL_COMPAT_H
#define MCA_BTL_RINGBTL_COMPAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if RINGBTL_OMPI5
#    include <pthread.h>
#    include "ompi5/opal5.h"
#else
#    include "opal_config.h"
#    include "opal/class/opal_free_list.h"
#    include "opal/datatype/opal_convertor.h"
#    include "opal/mca/base/mca_base_var.h"
#    include "opal/mca/btl/base/base.h"
#    include "opal/mca/btl/btl.h"
#    include "opal/mca/pmix/pmix.h"
#    include "opal/runtime/opal.h"
#    include "opal/threads/thread_usage.h"
#    include "opal/util/error.h"
#    include "opal/util/output.h"
#    include "opal/util/proc.h"
#endif

BEGIN_C_DECLS

/* The BTL interface version the component is built for, in messages. */
#if RINGBTL_OMPI5
#    define RINGBTL_BTL_INTERFACE "3.3"
#else
#    define RINGBTL_BTL_INTERFACE "3.1"
#endif

/* True when the running Open MPI is the one the component was built for (series, and in
 * 5.0 the layouts it shares); otherwise says what differs and returns false: the component
 * then declines. Runs once; later calls return the first answer. */
bool ringbtl_compat_check(void);

/* This process's name (jobid, vpid). */
opal_process_name_t ringbtl_compat_my_name(void);

/* The number of processes of this job, or 0 where the modex cannot read another job's data
 * (Open MPI 5: processes of other jobs are then unreachable through the component). */
uint32_t ringbtl_compat_job_size(void);

/* The number of processes of this job as the launcher tells it, 0 when it does not. */
uint32_t ringbtl_compat_world_size(void);

/* The modex: this process's addresses, under the component's key, and the job key under
 * `key`. A receive returns OPAL_SUCCESS and a malloc'ed copy (*len bytes for the
 * addresses; a NUL-terminated string for the job key), or an error. */
int ringbtl_compat_modex_send_uris(const mca_base_component_t *c, const char *uris);
int ringbtl_compat_modex_recv_uris(const mca_base_component_t *c,
                                   const opal_process_name_t *peer, char **uris, size_t *len);
int ringbtl_compat_modex_send_string(const char *key, const char *value);
int ringbtl_compat_modex_recv_string(const char *key, const opal_process_name_t *peer,
                                     char **value);
/* Releases what the modex needed (5.0: the PMIx reference taken on first use). */
void ringbtl_compat_fini(void);

/* Tells Open MPI that it is entered from more than one thread (opal_using_threads): the
 * component's progress thread calls into ob1. */
void ringbtl_compat_set_using_threads(void);

/* Hands a received message to the upper layer registered for `tag`; false when none is. */
bool ringbtl_compat_deliver(mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                            uint8_t tag, const void *data, size_t len);

/* Messages shorter than this are handed to the upper layer from a buffer with at least
 * this many bytes of room: ob1 in Open MPI 5.0 may write past the end of a short message
 * it is handed (0: no such need). */
#if RINGBTL_OMPI5
#    define RINGBTL_COMPAT_RX_ROOM 128
#else
#    define RINGBTL_COMPAT_RX_ROOM 0
#endif

/* True when the convertor's data may be sent in place (contiguous, homogeneous). */
#if RINGBTL_OMPI5
static inline bool ringbtl_compat_inplace(struct opal_convertor_t *conv)
{
    (void) conv;
    return false;
}
#else
static inline bool ringbtl_compat_inplace(struct opal_convertor_t *conv)
{
    return !opal_convertor_need_buffers(conv);
}
#endif

/* Open MPI's blocking PMIx calls made outside progress first call `flush` (4.1); `on`
 * false puts them back. */
void ringbtl_compat_wrap_blocking(bool on, void (*flush)(void));

/* ---- fragment pools ------------------------------------------------------------------- */
/* Under ThreadSanitizer: a fragment passes from the thread that returns it to the thread
 * that takes it next through Open MPI 4.1's lock-free free list, whose ordering rests on
 * fences TSan does not model; these tell TSan of the hand-over (no code otherwise). */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#    define RINGBTL_TSAN_ACQUIRE(addr) __tsan_acquire(addr)
#    define RINGBTL_TSAN_RELEASE(addr) __tsan_release(addr)
#else
#    define RINGBTL_TSAN_ACQUIRE(addr) ((void) (addr))
#    define RINGBTL_TSAN_RELEASE(addr) ((void) (addr))
#endif
#if RINGBTL_OMPI5
typedef struct {
    pthread_mutex_t lock;
    opal_free_list_item_t *free; /* a stack linked through ptr */
    void **all;                  /* every item allocated, freed at fini */
    size_t nall, cap;
    size_t elem_size;
    opal_class_t *cls;
    size_t max; /* 0: no limit */
    opal_free_list_item_init_fn_t item_init;
    void *ctx;
} ringbtl_pool_t;
void ringbtl_pool_construct(ringbtl_pool_t *p);
int ringbtl_pool_init(ringbtl_pool_t *p, size_t elem_size, opal_class_t *cls, int num, int max,
                      int inc, opal_free_list_item_init_fn_t item_init, void *ctx);
opal_free_list_item_t *ringbtl_pool_get(ringbtl_pool_t *p);
void ringbtl_pool_return(ringbtl_pool_t *p, opal_free_list_item_t *item);
void ringbtl_pool_destruct(ringbtl_pool_t *p);
#else
typedef opal_free_list_t ringbtl_pool_t;
static inline void ringbtl_pool_construct(ringbtl_pool_t *p)
{
    OBJ_CONSTRUCT(p, opal_free_list_t);
}
static inline int ringbtl_pool_init(ringbtl_pool_t *p, size_t elem_size, opal_class_t *cls,
                                    int num, int max, int inc,
                                    opal_free_list_item_init_fn_t item_init, void *ctx)
{
    return opal_free_list_init(p, elem_size, opal_cache_line_size, cls, 0, opal_cache_line_size,
                               num, max, inc, NULL, 0, NULL, item_init, ctx);
}
static inline opal_free_list_item_t *ringbtl_pool_get(ringbtl_pool_t *p)
{
    opal_free_list_item_t *item = opal_free_list_get(p);
    if (NULL != item) {
        RINGBTL_TSAN_ACQUIRE(item);
    }
    return item;
}
static inline void ringbtl_pool_return(ringbtl_pool_t *p, opal_free_list_item_t *item)
{
    RINGBTL_TSAN_RELEASE(item);
    opal_free_list_return(p, item);
}
static inline void ringbtl_pool_destruct(ringbtl_pool_t *p)
{
    OBJ_DESTRUCT(p);
}
#endif

END_C_DECLS

#endif
