/*
 * The series-specific part of the component (btl_ringbtl_compat.h says what differs).
 */
#if RINGBTL_OMPI5 && !defined(_GNU_SOURCE)
#    define _GNU_SOURCE 1 /* dladdr1 */
#endif
#include "btl_ringbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if RINGBTL_OMPI5
/* ==== Open MPI 5.0 (BTL 3.3) ========================================================== */

#    include <dlfcn.h>
#    include <link.h>

#    include <pmix.h>

/* ---- load-time checks ---------------------------------------------------------------- */

/* The size of the object (variable) at `addr` as its library's symbol table gives it, or 0
 * when it cannot be told. */
static size_t symbol_size(const void *addr)
{
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (0 == dladdr1(addr, &info, (void **) &sym, RTLD_DL_SYMENT) || NULL == sym) {
        return 0;
    }
    return (size_t) sym->st_size;
}

/* One comparison; says what differs. */
static bool same(const char *what, size_t theirs, size_t ours)
{
    if (theirs == ours) {
        return true;
    }
    opal_output(0,
                "btl ringbtl: Open MPI's %s is %zu bytes here, %zu in the Open MPI 5.0 build "
                "the component was made for",
                what, theirs, ours);
    return false;
}

static bool check_once(void)
{
    bool ok = true;
    int major = -1, minor = -1;

    /* The series: 5.0.x. */
    if (2 != sscanf(opal_version_string, "%d.%d", &major, &minor) || OPAL_MAJOR_VERSION != major
        || OPAL_MINOR_VERSION != minor) {
        opal_output(0, "btl ringbtl: built for Open MPI %s but running under Open MPI %s",
                    OPAL_IDENT_STRING, opal_version_string);
        ok = false;
    }
    /* What the component embeds or indexes, from the library's own class objects (their
     * instance sizes) and symbol table. A build with debugging (OPAL_ENABLE_DEBUG) has
     * larger objects and list items, and so fails here. */
    ok &= same("opal_object_t", opal_object_t_class.cls_sizeof, sizeof(opal_object_t));
    ok &= same("opal_list_item_t", opal_list_item_t_class.cls_sizeof, sizeof(opal_list_item_t));
    ok &= same("opal_free_list_item_t", opal_free_list_item_t_class.cls_sizeof,
               sizeof(opal_free_list_item_t));
    ok &= same("mca_btl_base_descriptor_t", mca_btl_base_descriptor_t_class.cls_sizeof,
               sizeof(mca_btl_base_descriptor_t));
    ok &= same("opal_proc_t", opal_proc_t_class.cls_sizeof, sizeof(opal_proc_t));
    ok &= same("active-message table (mca_btl_base_active_message_trigger)",
               symbol_size(mca_btl_base_active_message_trigger),
               sizeof(mca_btl_active_message_callback_t) * MCA_BTL_TAG_MAX);
    /* btl tcp's module starts with mca_btl_base_module_t: a witness of its size. */
    void *tcp = dlsym(RTLD_DEFAULT, "mca_btl_tcp_module");
    if (NULL == tcp) {
        opal_output(0, "btl ringbtl: Open MPI has no btl tcp module (mca_btl_tcp_module) to "
                       "check the BTL module's layout against");
        ok = false;
    } else {
        ok &= same("btl tcp module (mca_btl_tcp_module)", symbol_size(tcp),
                   sizeof(mca_btl_base_module_t) + RINGBTL_OMPI5_TCP_MODULE_TAIL);
    }
    /* The modex goes through PMIx (Open MPI 5.0 requires PMIx 4 or later). */
    const char *pv = PMIx_Get_version();
    int pmajor = -1;
    if (NULL == pv || 1 != sscanf(pv, "OpenPMIx %d", &pmajor) || pmajor < 4) {
        opal_output(0, "btl ringbtl: PMIx %s: version 4 or later needed",
                    NULL != pv ? pv : "(unknown)");
        ok = false;
    }
    if (!ok) {
        opal_output(0, "btl ringbtl: this Open MPI (%s) does not match the layout the "
                       "component (BTL interface %s) was built for; the component declines",
                    opal_version_string, RINGBTL_BTL_INTERFACE);
    }
    return ok;
}

opal_process_name_t ringbtl_compat_my_name(void)
{
    return opal_proc_local_get()->proc_name;
}

uint32_t ringbtl_compat_job_size(void)
{
    /* The modex reads this job's namespace only (ringbtl_compat_modex_recv_string). */
    return 0;
}

/* ---- modex: PMIx ----------------------------------------------------------------------- */

static pmix_proc_t pmix_me;
static bool pmix_up;

static int pmix_ready(void)
{
    if (!pmix_up) {
        /* Open MPI initialised PMIx already: this takes a reference and tells our
         * namespace and rank. */
        pmix_status_t rc = PMIx_Init(&pmix_me, NULL, 0);
        if (PMIX_SUCCESS != rc) {
            opal_output(0, "btl ringbtl: PMIx_Init: %s", PMIx_Error_string(rc));
            return OPAL_ERROR;
        }
        pmix_up = true;
    }
    return OPAL_SUCCESS;
}

uint32_t ringbtl_compat_world_size(void)
{
    if (OPAL_SUCCESS != pmix_ready()) {
        return 0;
    }
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, pmix_me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    uint32_t n = 0;
    if (PMIX_SUCCESS == PMIx_Get(&all, PMIX_JOB_SIZE, NULL, 0, &v) && NULL != v
        && PMIX_UINT32 == v->type) {
        n = v->data.uint32;
    }
    if (NULL != v) {
        PMIX_VALUE_RELEASE(v);
    }
    return n;
}

void ringbtl_compat_fini(void)
{
    if (pmix_up) {
        pmix_up = false;
        (void) PMIx_Finalize(NULL, 0);
    }
}

void ringbtl_compat_set_using_threads(void)
{
    opal_uses_threads = true;
}

static void uris_key(const mca_base_component_t *c, char *key, size_t size)
{
    snprintf(key, size, "%s.%s.uris", c->mca_type_name, c->mca_component_name);
}

int ringbtl_compat_modex_send_string(const char *key, const char *value)
{
    if (OPAL_SUCCESS != pmix_ready()) {
        return OPAL_ERROR;
    }
    pmix_value_t v;
    memset(&v, 0, sizeof(v));
    v.type = PMIX_STRING;
    v.data.string = (char *) value; /* PMIx_Put copies it */
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (PMIX_SUCCESS == rc) {
        rc = PMIx_Commit();
    }
    if (PMIX_SUCCESS != rc) {
        opal_output(0, "btl ringbtl: PMIx_Put %s: %s", key, PMIx_Error_string(rc));
        return OPAL_ERROR;
    }
    return OPAL_SUCCESS;
}

int ringbtl_compat_modex_recv_string(const char *key, const opal_process_name_t *peer,
                                     char **value)
{
    *value = NULL;
    if (OPAL_SUCCESS != pmix_ready()) {
        return OPAL_ERROR;
    }
    /* The peers are processes of this job: our namespace, their vpid as rank. */
    pmix_proc_t p;
    memset(&p, 0, sizeof(p));
    PMIX_LOAD_PROCID(&p, pmix_me.nspace, (pmix_rank_t) peer->vpid);
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &v);
    if (PMIX_SUCCESS != rc || NULL == v) {
        return OPAL_ERR_NOT_FOUND;
    }
    int ret = OPAL_SUCCESS;
    if (PMIX_STRING != v->type || NULL == v->data.string) {
        ret = OPAL_ERR_NOT_FOUND;
    } else if (NULL == (*value = strdup(v->data.string))) {
        ret = OPAL_ERR_OUT_OF_RESOURCE;
    }
    PMIX_VALUE_RELEASE(v);
    return ret;
}

int ringbtl_compat_modex_send_uris(const mca_base_component_t *c, const char *uris)
{
    char key[128];
    uris_key(c, key, sizeof(key));
    return ringbtl_compat_modex_send_string(key, uris);
}

int ringbtl_compat_modex_recv_uris(const mca_base_component_t *c,
                                   const opal_process_name_t *peer, char **uris, size_t *len)
{
    char key[128];
    uris_key(c, key, sizeof(key));
    int rc = ringbtl_compat_modex_recv_string(key, peer, uris);
    *len = OPAL_SUCCESS == rc ? strlen(*uris) + 1 : 0;
    return rc;
}

/* ---- receive ----------------------------------------------------------------------------- */

bool ringbtl_compat_deliver(mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                            uint8_t tag, const void *data, size_t len)
{
    const mca_btl_active_message_callback_t *reg = &mca_btl_base_active_message_trigger[tag];
    /* A short message is handed over from here, with room behind it (RINGBTL_COMPAT_RX_ROOM);
     * on the stack, so a callback that receives again does not reuse it. */
    _Alignas(64) unsigned char room[2 * RINGBTL_COMPAT_RX_ROOM];
    if (NULL == reg->cbfunc) {
        return false;
    }
    if (len < RINGBTL_COMPAT_RX_ROOM) {
        memcpy(room, data, len);
        memset(room + len, 0, sizeof(room) - len);
        data = room;
    }
    mca_btl_base_segment_t seg;
    seg.seg_addr.pval = (void *) data;
    seg.seg_len = len;
    const mca_btl_base_receive_descriptor_t des = {
        .endpoint = ep,
        .des_segments = &seg,
        .des_segment_count = 1,
        .tag = tag,
        .cbdata = reg->cbdata,
    };
    reg->cbfunc(btl, &des);
    return true;
}

/* Open MPI 5.0 calls PMIx directly: no table to wrap. */
void ringbtl_compat_wrap_blocking(bool on, void (*flush)(void))
{
    (void) on;
    (void) flush;
}

/* ---- fragment pools ---------------------------------------------------------------------- */

void ringbtl_pool_construct(ringbtl_pool_t *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
}

/* A new item, constructed as an object of the pool's class; NULL at the limit or without
 * memory. Called with the lock held. */
static opal_free_list_item_t *pool_new(ringbtl_pool_t *p)
{
    if ((0 != p->max && p->nall >= p->max)) {
        return NULL;
    }
    if (p->nall == p->cap) {
        const size_t cap = p->cap ? 2 * p->cap : 64;
        void **all = realloc(p->all, cap * sizeof(*all));
        if (NULL == all) {
            return NULL;
        }
        p->all = all;
        p->cap = cap;
    }
    void *mem = NULL;
    const size_t align = opal_cache_line_size > 64 ? (size_t) opal_cache_line_size : 64;
    if (0 != posix_memalign(&mem, align, p->elem_size)) {
        return NULL;
    }
    memset(mem, 0, p->elem_size);
    opal_free_list_item_t *item = mem;
    ringbtl_obj_construct(&item->super.super, p->cls);
    if (NULL != p->item_init && OPAL_SUCCESS != p->item_init(item, p->ctx)) {
        free(mem);
        return NULL;
    }
    p->all[p->nall++] = mem;
    return item;
}

int ringbtl_pool_init(ringbtl_pool_t *p, size_t elem_size, opal_class_t *cls, int num, int max,
                      int inc, opal_free_list_item_init_fn_t item_init, void *ctx)
{
    (void) inc;
    p->elem_size = elem_size;
    p->cls = cls;
    p->max = max > 0 ? (size_t) max : 0;
    p->item_init = item_init;
    p->ctx = ctx;
    for (int i = 0; i < num; i++) {
        opal_free_list_item_t *item = pool_new(p);
        if (NULL == item) {
            return OPAL_ERR_OUT_OF_RESOURCE;
        }
        ringbtl_pool_return(p, item);
    }
    return OPAL_SUCCESS;
}

opal_free_list_item_t *ringbtl_pool_get(ringbtl_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    opal_free_list_item_t *item = p->free;
    if (NULL != item) {
        p->free = (opal_free_list_item_t *) item->super.opal_list_next;
        item->super.opal_list_next = NULL;
    } else {
        item = pool_new(p);
    }
    pthread_mutex_unlock(&p->lock);
    return item;
}

void ringbtl_pool_return(ringbtl_pool_t *p, opal_free_list_item_t *item)
{
    pthread_mutex_lock(&p->lock);
    item->super.opal_list_next = (volatile opal_list_item_t *) p->free;
    p->free = item;
    pthread_mutex_unlock(&p->lock);
}

void ringbtl_pool_destruct(ringbtl_pool_t *p)
{
    for (size_t i = 0; i < p->nall; i++) {
        free(p->all[i]);
    }
    free(p->all);
    p->all = NULL;
    p->nall = p->cap = 0;
    p->free = NULL;
    pthread_mutex_destroy(&p->lock);
}

#else
/* ==== Open MPI 4.1 (BTL 3.1) ========================================================== */

/* Open MPI's internal structures may change between minor versions: only the series the
 * component was built against is accepted. */
static bool check_once(void)
{
    int major = -1, minor = -1;
    const char *v = opal_version_string;
    if (2 != sscanf(v, "%d.%d", &major, &minor) || major != OPAL_MAJOR_VERSION
        || minor != OPAL_MINOR_VERSION) {
        opal_output(0,
                    "btl ringbtl: built against Open MPI %s but running under Open MPI %s; "
                    "the component declines to load (rebuild it with tools/build-ompi.sh "
                    "against the installed headers)",
                    OPAL_IDENT_STRING, v);
        return false;
    }
    return true;
}

opal_process_name_t ringbtl_compat_my_name(void)
{
    return OPAL_PROC_MY_NAME;
}

uint32_t ringbtl_compat_job_size(void)
{
    opal_process_name_t all = OPAL_PROC_MY_NAME;
    uint32_t n = 0, *np = &n;
    int rc;
    all.vpid = OPAL_VPID_WILDCARD;
    OPAL_MODEX_RECV_VALUE_OPTIONAL(rc, OPAL_PMIX_JOB_SIZE, &all, &np, OPAL_UINT32);
    return OPAL_SUCCESS == rc ? n : 0;
}

uint32_t ringbtl_compat_world_size(void)
{
    return ringbtl_compat_job_size();
}

void ringbtl_compat_fini(void)
{
}

void ringbtl_compat_set_using_threads(void)
{
    (void) opal_set_using_threads(true);
}

int ringbtl_compat_modex_send_string(const char *key, const char *value)
{
    int rc;
    char *k = (char *) key;   /* not kept */
    char *v = (char *) value; /* copied by the modex */
    OPAL_MODEX_SEND_VALUE(rc, OPAL_PMIX_GLOBAL, k, v, OPAL_STRING);
    return rc;
}

int ringbtl_compat_modex_recv_string(const char *key, const opal_process_name_t *peer,
                                     char **value)
{
    int rc;
    *value = NULL;
    OPAL_MODEX_RECV_VALUE(rc, key, (opal_process_name_t *) peer, value, OPAL_STRING);
    if (OPAL_SUCCESS == rc && NULL == *value) {
        rc = OPAL_ERR_NOT_FOUND;
    }
    return rc;
}

int ringbtl_compat_modex_send_uris(const mca_base_component_t *c, const char *uris)
{
    int rc;
    OPAL_MODEX_SEND(rc, OPAL_PMIX_GLOBAL, (mca_base_component_t *) c, uris, strlen(uris) + 1);
    return rc;
}

int ringbtl_compat_modex_recv_uris(const mca_base_component_t *c,
                                   const opal_process_name_t *peer, char **uris, size_t *len)
{
    int rc;
    *uris = NULL;
    *len = 0;
    OPAL_MODEX_RECV(rc, (mca_base_component_t *) c, (opal_process_name_t *) peer, (void **) uris,
                    len);
    return rc;
}

bool ringbtl_compat_deliver(mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                            uint8_t tag, const void *data, size_t len)
{
    const mca_btl_active_message_callback_t *reg = &mca_btl_base_active_message_trigger[tag];
    mca_btl_base_segment_t seg;
    mca_btl_base_descriptor_t des;
    (void) ep;

    if (NULL == reg->cbfunc) {
        return false;
    }
    memset(&des, 0, sizeof(des));
    seg.seg_addr.pval = (void *) data;
    seg.seg_len = len;
    des.des_segments = &seg;
    des.des_segment_count = 1;
    des.order = MCA_BTL_NO_ORDER;
    reg->cbfunc(btl, tag, &des, reg->cbdata);
    return true;
}

/* ---- blocking outside MPI -------------------------------------------------------------- */

/* Every blocking PMIx call of the client API that Open MPI 4.1 makes after start-up (fence,
 * connect, disconnect, publish, lookup, unpublish, spawn) goes through its table opal_pmix:
 * its entries are wrapped while the module lives, so that `flush` runs first, and put
 * back at finalize. */
static void (*blocking_flush)(void);
static struct {
    bool active;
    opal_pmix_base_module_fence_fn_t fence;
    opal_pmix_base_module_connect_fn_t connect;
    opal_pmix_base_module_disconnect_fn_t disconnect;
    opal_pmix_base_module_publish_fn_t publish;
    opal_pmix_base_module_lookup_fn_t lookup;
    opal_pmix_base_module_unpublish_fn_t unpublish;
    opal_pmix_base_module_spawn_fn_t spawn;
} pmix_orig;

static int wrap_fence(opal_list_t *procs, int collect_data)
{
    blocking_flush();
    return pmix_orig.fence(procs, collect_data);
}
static int wrap_connect(opal_list_t *procs)
{
    blocking_flush();
    return pmix_orig.connect(procs);
}
static int wrap_disconnect(opal_list_t *procs)
{
    blocking_flush();
    return pmix_orig.disconnect(procs);
}
static int wrap_publish(opal_list_t *info)
{
    blocking_flush();
    return pmix_orig.publish(info);
}
static int wrap_lookup(opal_list_t *data, opal_list_t *info)
{
    blocking_flush();
    return pmix_orig.lookup(data, info);
}
static int wrap_unpublish(char **keys, opal_list_t *info)
{
    blocking_flush();
    return pmix_orig.unpublish(keys, info);
}
static int wrap_spawn(opal_list_t *job_info, opal_list_t *apps, opal_jobid_t *jobid)
{
    blocking_flush();
    return pmix_orig.spawn(job_info, apps, jobid);
}

/* Wraps (or, with `on` false, puts back) each entry that is set. */
void ringbtl_compat_wrap_blocking(bool on, void (*flush)(void))
{
#    define RINGBTL_WRAP(name)                                                           \
        do {                                                                             \
            if (on && NULL != opal_pmix.name) {                                          \
                pmix_orig.name = opal_pmix.name;                                         \
                opal_pmix.name = wrap_##name;                                            \
            } else if (!on && NULL != pmix_orig.name && wrap_##name == opal_pmix.name) { \
                opal_pmix.name = pmix_orig.name;                                         \
            }                                                                            \
        } while (0)
    if (on == pmix_orig.active) {
        return;
    }
    if (on) {
        blocking_flush = flush;
    }
    RINGBTL_WRAP(fence);
    RINGBTL_WRAP(connect);
    RINGBTL_WRAP(disconnect);
    RINGBTL_WRAP(publish);
    RINGBTL_WRAP(lookup);
    RINGBTL_WRAP(unpublish);
    RINGBTL_WRAP(spawn);
#    undef RINGBTL_WRAP
    pmix_orig.active = on;
}

#endif

/* The check of the running Open MPI (check_once, above), made once: its answer holds
 * for the life of the process. */
bool ringbtl_compat_check(void)
{
    static int answer = -1;
    if (answer < 0) {
        answer = check_once() ? 1 : 0;
    }
    return 1 == answer;
}
