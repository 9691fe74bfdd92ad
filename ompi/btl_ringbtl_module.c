/*
 * mca_btl_ringbtl module: peers (add_procs/del_procs), descriptors (alloc/free/
 * prepare_src), send/sendi, put and memory registration, completion and receive
 * callbacks, error reporting, finalize.
 */
#include "btl_ringbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static void frag_construct(mca_btl_ringbtl_frag_t *f)
{
    f->buf = (unsigned char *) (f + 1);
    f->cap = 0;
    f->list = NULL;
    f->ep = NULL;
    f->base.des_segments = f->segs;
    f->base.des_segment_count = 1;
}
OBJ_CLASS_INSTANCE(mca_btl_ringbtl_frag_t, mca_btl_base_descriptor_t, frag_construct, NULL);
OBJ_CLASS_INSTANCE(mca_btl_ringbtl_put_t, opal_free_list_item_t, NULL, NULL);

/* ---- ringbtl status -> Open MPI status ------------------------------------------------ */

static int status_to_opal(int rc)
{
    switch (rc) {
    case RINGBTL_OK:
        return OPAL_SUCCESS;
    case RINGBTL_ERR_UNREACHABLE:
    case RINGBTL_ERR_UNKNOWN_PEER:
    case RINGBTL_ERR_PEER_CLOSED:
    case RINGBTL_ERR_PROTOCOL:
    case RINGBTL_ERR_TIMEOUT:
    case RINGBTL_ERR_SHUTDOWN:
        return OPAL_ERR_UNREACH;
    case RINGBTL_ERR_WOULD_BLOCK:
        return OPAL_ERR_OUT_OF_RESOURCE;
    case RINGBTL_ERR_TOO_LARGE:
        return OPAL_ERR_BAD_PARAM;
    default:
        return OPAL_ERROR;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* ---- fragments ------------------------------------------------------------------------ */

static int frag_item_init(opal_free_list_item_t *item, ringbtl_pool_t *list, size_t cap)
{
    mca_btl_ringbtl_frag_t *f = (mca_btl_ringbtl_frag_t *) item;
    f->list = list;
    f->cap = cap;
    return OPAL_SUCCESS;
}

/* The item initialisers of a module's two fragment lists (ctx: the module). */
static int eager_item_init(opal_free_list_item_t *item, void *ctx)
{
    mca_btl_ringbtl_module_t *m = ctx;
    return frag_item_init(item, &m->eager_frags, m->super.btl_eager_limit);
}

static int max_item_init(opal_free_list_item_t *item, void *ctx)
{
    mca_btl_ringbtl_module_t *m = ctx;
    return frag_item_init(item, &m->max_frags, m->super.btl_max_send_size);
}

/* A fragment with room for `size` bytes, or NULL (too large, or no memory). */
static mca_btl_ringbtl_frag_t *frag_get(mca_btl_ringbtl_module_t *m, size_t size)
{
    ringbtl_pool_t *list;
    if (size <= m->super.btl_eager_limit) {
        list = &m->eager_frags;
    } else if (size <= m->super.btl_max_send_size) {
        list = &m->max_frags;
    } else {
        return NULL;
    }
    mca_btl_ringbtl_frag_t *f = (mca_btl_ringbtl_frag_t *) ringbtl_pool_get(list);
    if (NULL == f) {
        return NULL;
    }
    f->base.des_segments = f->segs;
    f->base.des_segment_count = 1;
    f->base.des_cbfunc = NULL;
    f->base.des_cbdata = NULL;
    f->base.des_context = NULL;
    f->base.des_flags = 0;
    f->base.order = MCA_BTL_NO_ORDER;
    f->segs[0].seg_addr.pval = f->buf;
    f->segs[0].seg_len = size;
    f->segs[1].seg_addr.pval = NULL;
    f->segs[1].seg_len = 0;
    f->ep = NULL;
    return f;
}

static void frag_return(mca_btl_ringbtl_frag_t *f)
{
    ringbtl_pool_return(f->list, (opal_free_list_item_t *) f);
}

/* ---- callbacks from ringbtl ----------------------------------------------------------- */

/* Exactly once per accepted ringbtl_send: the fragment's send is over. */
static void complete_frag(mca_btl_ringbtl_module_t *m, mca_btl_ringbtl_frag_t *f, int status)
{
    /* Read ownership first: the callback may free a descriptor ob1 owns. */
    const bool btl_owns = 0 != (f->base.des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP);
    if (!m->closing && NULL != f->base.des_cbfunc) {
        f->base.des_cbfunc(&m->super, f->ep, &f->base, status_to_opal(status));
    }
    if (btl_owns) {
        frag_return(f);
    }
}

/* Exactly once per accepted ringbtl_put (the data left, or never will) or ringbtl_get (the
 * data is in place, or never will be). */
static void complete_put(mca_btl_ringbtl_module_t *m, mca_btl_ringbtl_put_t *p, int status)
{
    if (!m->closing && NULL != p->cbfunc) {
        p->cbfunc(&m->super, p->ep, p->local_address, p->local_handle, p->cbcontext,
                  p->cbdata, status_to_opal(status));
    }
    ringbtl_pool_return(&m->puts, &p->super);
}

/* A put's or get's cookie is its descriptor's address with the low bit set (descriptors
 * are aligned); a send's is its fragment's. */
#define PUT_COOKIE 1u

static void complete_cookie(mca_btl_ringbtl_module_t *m, uint64_t cookie, int status)
{
    if (cookie & PUT_COOKIE) {
        complete_put(m, (mca_btl_ringbtl_put_t *) (uintptr_t) (cookie & ~(uint64_t) PUT_COOKIE),
                     status);
        return;
    }
    complete_frag(m, (mca_btl_ringbtl_frag_t *) (uintptr_t) cookie, status);
}

/* Holds a failed operation's completion until its peer's failure has been reported (see
 * mca_btl_ringbtl_module_t.held). False when it is to be delivered now: the peer was
 * reported already, the peer closed cleanly (reported at verbose level only), finalize
 * started, or no memory. */
static bool hold_failed(mca_btl_ringbtl_module_t *m, uint32_t peer, uint64_t cookie, int status)
{
    const mca_btl_ringbtl_endpoint_t *ep = peer < m->nendpoints ? m->endpoints[peer] : NULL;
    if (m->closing || RINGBTL_ERR_PEER_CLOSED == status || NULL == ep || ep->failed) {
        return false;
    }
    if (m->nheld == m->held_cap) {
        const size_t cap = m->held_cap ? 2 * m->held_cap : 64;
        mca_btl_ringbtl_held_t *h = realloc(m->held, cap * sizeof(*h));
        if (NULL == h) {
            return false;
        }
        m->held = h;
        m->held_cap = cap;
    }
    m->held[m->nheld++] =
        (mca_btl_ringbtl_held_t) {.cookie = cookie, .peer = peer, .status = status};
    return true;
}

/* Delivers the held completions of `peer` (UINT32_MAX: of every peer), in the order they
 * came. One at a time, taken out before its callback runs: the callback may send and
 * progress, and so come back here. */
static void release_held(mca_btl_ringbtl_module_t *m, uint32_t peer)
{
    size_t i = 0;
    while (i < m->nheld) {
        if (UINT32_MAX != peer && m->held[i].peer != peer) {
            i++;
            continue;
        }
        const mca_btl_ringbtl_held_t h = m->held[i];
        memmove(&m->held[i], &m->held[i + 1], (m->nheld - i - 1) * sizeof(h));
        m->nheld--;
        complete_cookie(m, h.cookie, h.status);
        i = 0;
    }
}

/* After a progress: whatever is still held (its peer not reported in that progress) is
 * delivered, so that every operation completes. */
void mca_btl_ringbtl_release_held(mca_btl_ringbtl_module_t *m)
{
    release_held(m, UINT32_MAX);
}

static void on_complete(void *ctx, uint32_t peer, uint64_t cookie, int status)
{
    mca_btl_ringbtl_module_t *m = ctx;
    if (OPAL_UNLIKELY(RINGBTL_OK != status) && hold_failed(m, peer, cookie, status)) {
        return;
    }
    complete_cookie(m, cookie, status);
}

static void deliver(mca_btl_ringbtl_module_t *m, uint32_t src, uint8_t tag, const void *data,
                    size_t len);

/* Losing a received message breaks MPI's guarantees: the job must hear of it. */
static void lost_message(mca_btl_ringbtl_module_t *m, uint32_t src, size_t len)
{
    char text[128];
    snprintf(text, sizeof(text), "btl ringbtl: out of memory for a %zu-byte message from rank %u",
             len, (unsigned) src);
    if (NULL != m->error_cb) {
        mca_btl_ringbtl_endpoint_t *ep = src < m->nendpoints ? m->endpoints[src] : NULL;
        m->error_cb(&m->super, MCA_BTL_ERROR_FLAGS_FATAL, NULL != ep ? ep->proc : NULL, text);
    } else {
        opal_output(0, "%s", text);
    }
}

/* A received message: hand it to the upper layer registered for `tag`. The bytes are
 * ringbtl's, valid during this call only, which is what the BTL receive contract asks. */
static void on_recv(void *ctx, uint32_t src, uint8_t tag, const void *data, size_t len)
{
    mca_btl_ringbtl_module_t *m = ctx;
    deliver(m, src, tag, data, len);
}

static void deliver(mca_btl_ringbtl_module_t *m, uint32_t src, uint8_t tag, const void *data,
                    size_t len)
{
    if (NULL == mca_btl_base_active_message_trigger[tag].cbfunc) {
        opal_output(0, "btl ringbtl: message with tag %u from rank %u has no receiver; dropped",
                    (unsigned) tag, (unsigned) src);
        return;
    }
    m->rx_frames++;
    m->rx_bytes += len;
    /* ob1 reads its headers through typed pointers: give it 8-byte aligned bytes. */
    if (0 != ((uintptr_t) data & 7) && len > 0) {
        m->rx_copied_frames++;
        m->rx_copied_bytes += len;
        if (len > m->scratch_len) {
            void *p = NULL;
            if (0 != posix_memalign(&p, 64, len)) {
                lost_message(m, src, len);
                return;
            }
            free(m->scratch);
            m->scratch = p;
            m->scratch_len = len;
        }
        memcpy(m->scratch, data, len);
        data = m->scratch;
    }
    (void) ringbtl_compat_deliver(&m->super, src < m->nendpoints ? m->endpoints[src] : NULL, tag,
                                  data, len);
}

/* Once per failed peer, after the completions of its failed operations, which are held
 * until here (hold_failed): the report names the peer, then they are delivered. ob1's
 * error callback aborts the job, so the report is the last word of this process. A clean
 * close (FIN) while sends were pending is not a fault of the network: it is reported at
 * verbose level only. */
static void on_error(void *ctx, uint32_t peer, int status, const char *msg)
{
    mca_btl_ringbtl_module_t *m = ctx;
    mca_btl_ringbtl_endpoint_t *ep = peer < m->nendpoints ? m->endpoints[peer] : NULL;
    char text[512];

    if (NULL != ep) {
        ep->failed = true;
    }
    if (m->closing) {
        /* Nothing is reported any more. */
    } else if (RINGBTL_ERR_PEER_CLOSED == status) {
        if (mca_btl_ringbtl_component.verbose > 0) {
            opal_output(0, "btl ringbtl: rank %u closed its connections: %s", (unsigned) peer,
                        msg);
        }
    } else {
        snprintf(text, sizeof(text), "btl ringbtl: connection to rank %u failed: %s (%s)",
                 (unsigned) peer, ringbtl_strerror(status), msg);
        if (NULL != m->error_cb) {
            m->error_cb(&m->super, MCA_BTL_ERROR_FLAGS_FATAL, NULL != ep ? ep->proc : NULL,
                        text);
        } else {
            opal_output(0, "%s", text);
        }
    }
    release_held(m, peer);
}

/* ---- peers ---------------------------------------------------------------------------- */

static int ensure_endpoint_slots(mca_btl_ringbtl_module_t *m, uint32_t vpid)
{
    if (vpid < m->nendpoints) {
        return OPAL_SUCCESS;
    }
    uint32_t n = m->nendpoints ? m->nendpoints : 16;
    while (n <= vpid) {
        n *= 2;
    }
    mca_btl_ringbtl_endpoint_t **e = realloc(m->endpoints, n * sizeof(*e));
    if (NULL == e) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    memset(e + m->nendpoints, 0, (n - m->nendpoints) * sizeof(*e));
    m->endpoints = e;
    m->nendpoints = n;
    return OPAL_SUCCESS;
}

/* The addresses of peer `peer` (its modex entry: its shards' URI lists separated by
 * RINGBTL_SHARD_SEP, or its modules' separated by RINGBTL_MODULE_SEP) that module `m`
 * connects to, as one URI list. With shards: "" and *elsewhere true when the pair belongs
 * to another of this process's modules; else the list of the pair's shard. Within it, all
 * addresses for the one module; for a module per interface, those on its interface's
 * subnets, so that each module talks to the peer's module on the same network ("" when
 * there are none, except for the first module, which then takes them all: a peer reached
 * only through a router). NULL when memory ran out. */
static char *peer_uris(const mca_btl_ringbtl_module_t *m, const char *published, uint32_t peer,
                       bool *elsewhere)
{
    unsigned theirs = 1;
    for (const char *q = published; '\0' != *q; q++) {
        theirs += RINGBTL_SHARD_SEP == *q;
    }
    const unsigned shard = mca_btl_ringbtl_pair_shard((uint32_t) ringbtl_compat_my_name().vpid,
                                                      peer, m->nshards, theirs);
    *elsewhere = shard != m->shard;
    for (unsigned k = 0; k < shard; k++) {
        published = strchr(published, RINGBTL_SHARD_SEP) + 1;
    }
    const size_t len =
        *elsewhere ? 0 : strcspn(published, (const char[]) {RINGBTL_SHARD_SEP, '\0'});
    const char *end = published + len;
    char *out = malloc(len + 1);
    size_t used = 0;
    if (NULL == out) {
        return NULL;
    }
    for (const char *p = published; p < end;) {
        size_t n = strcspn(p, (const char[]) {';', RINGBTL_MODULE_SEP, RINGBTL_SHARD_SEP, '\0'});
        bool take = 0 == m->nnets;
        int family;
        uint8_t addr[16];
        if (!take && mca_btl_ringbtl_uri_addr(p, n, &family, addr)) {
            for (unsigned i = 0; i < m->nnets && !take; i++) {
                take = mca_btl_ringbtl_net_contains(&m->nets[i], family, addr);
            }
        }
        if (take && n > 0) {
            if (used > 0) {
                out[used++] = ';';
            }
            memcpy(out + used, p, n);
            used += n;
        }
        p += n;
        if (p < end) {
            p++;
        }
    }
    out[used] = '\0';
    if (0 == used && 0 == m->index && !*elsewhere) {
        /* Routed: every address, one list. */
        for (size_t i = 0; i < len; i++) {
            out[i] = RINGBTL_MODULE_SEP == published[i] ? ';' : published[i];
        }
        out[len] = '\0';
    }
    return out;
}

/* Lets the processes of job `job` connect: reads the public key its rank 0 published
 * (readable once the two jobs connected) and gives it to ringbtl, once per job. False, said
 * when verbose, when the job cannot be added: its processes are then unreachable. */
static bool ensure_job(mca_btl_ringbtl_module_t *m, opal_jobid_t job)
{
    int verbose = mca_btl_ringbtl_component.verbose;
    for (size_t i = 0; i < m->njobs; i++) {
        if (m->jobs[i] == job) {
            return true;
        }
    }
    if (0 == m->foreign_base) {
        m->foreign_base = m->next_foreign = ringbtl_compat_job_size();
        if (0 == m->foreign_base) {
            if (verbose > 0) {
                opal_output(0, "btl ringbtl: processes of other jobs are not reachable "
                               "through this Open MPI's modex");
            }
            return false;
        }
    }
    opal_process_name_t root = ringbtl_compat_my_name();
    root.jobid = job;
    root.vpid = 0;
    char *pub = NULL;
    int rc = ringbtl_compat_modex_recv_string(RINGBTL_MODEX_JOB_PUB, &root, &pub);
    if (OPAL_SUCCESS != rc || NULL == pub) {
        if (verbose > 0) {
            opal_output(0, "btl ringbtl: job %s published no ringbtl key: its processes are "
                           "unreachable",
                        OPAL_NAME_PRINT(root));
        }
        free(pub);
        return false;
    }
    rc = ringbtl_add_job(m->rt, (uint64_t) job, pub);
    free(pub);
    if (RINGBTL_OK != rc) {
        opal_output(0, "btl ringbtl: job %s not added: %s", OPAL_NAME_PRINT(root),
                    ringbtl_last_error());
        return false;
    }
    opal_jobid_t *jobs = realloc(m->jobs, (m->njobs + 1) * sizeof(*jobs));
    if (NULL == jobs) {
        return false;
    }
    m->jobs = jobs;
    m->jobs[m->njobs++] = job;
    if (verbose > 1) {
        opal_output(0, "btl ringbtl: job %s added", OPAL_NAME_PRINT(root));
    }
    return true;
}

/* The ringbtl id of `p`, and whether it has one yet: its vpid for a process of this job;
 * for another job's, the id it was given, or the next free one (*known false). */
static uint32_t proc_id(const mca_btl_ringbtl_module_t *m, const opal_proc_t *p, bool *known)
{
    if (p->proc_name.jobid == ringbtl_compat_my_name().jobid) {
        *known = true;
        return (uint32_t) p->proc_name.vpid;
    }
    for (uint32_t i = m->foreign_base; i < m->next_foreign && i < m->nendpoints; i++) {
        const mca_btl_ringbtl_endpoint_t *ep = m->endpoints[i];
        if (NULL != ep && ep->proc->proc_name.jobid == p->proc_name.jobid
            && ep->proc->proc_name.vpid == p->proc_name.vpid) {
            *known = true;
            return i;
        }
    }
    *known = false;
    return m->next_foreign;
}

/* The endpoint of `p`, created and its addresses given to ringbtl on first use: NULL when
 * it published no address or none is usable (not an error), or when it failed. A process
 * of another job needs its job added first (ensure_job). OPAL_ERR_OUT_OF_RESOURCE in *rc
 * when memory ran out. */
static mca_btl_ringbtl_endpoint_t *add_proc(mca_btl_ringbtl_module_t *m, opal_proc_t *p,
                                            int *rc)
{
    int verbose = mca_btl_ringbtl_component.verbose;
    bool known = false;
    const bool foreign = p->proc_name.jobid != ringbtl_compat_my_name().jobid;
    uint32_t vpid = proc_id(m, p, &known);

    *rc = OPAL_SUCCESS;
    if (OPAL_SUCCESS != ensure_endpoint_slots(m, vpid)) {
        *rc = OPAL_ERR_OUT_OF_RESOURCE;
        return NULL;
    }
    mca_btl_ringbtl_endpoint_t *ep = known ? m->endpoints[vpid] : NULL;
    if (NULL == ep) {
        char *uris = NULL;
        size_t len = 0;
        int mrc;
        mrc = ringbtl_compat_modex_recv_uris(&mca_btl_ringbtl_component.super.btl_version,
                                             &p->proc_name, &uris, &len);
        if (OPAL_SUCCESS != mrc || NULL == uris || 0 == len || '\0' != uris[len - 1]) {
            if (verbose > 0) {
                opal_output(0, "btl ringbtl: %s published no ringbtl address: unreachable",
                            OPAL_NAME_PRINT(p->proc_name));
            }
            free(uris);
            return NULL;
        }
        bool elsewhere = false;
        char *mine = peer_uris(m, uris, (uint32_t) p->proc_name.vpid, &elsewhere);
        if (NULL == mine) {
            free(uris);
            *rc = OPAL_ERR_OUT_OF_RESOURCE;
            return NULL;
        }
        if ('\0' == mine[0]) {
            /* A peer of another shard is that module's. */
            if (verbose > 0 && !elsewhere) {
                opal_output(0, "btl ringbtl: %s has no address on the subnets of %s: "
                               "unreachable through its module",
                            OPAL_NAME_PRINT(p->proc_name), m->ifname);
            }
            free(mine);
            free(uris);
            return NULL;
        }
        free(uris);
        uris = mine;
        int frc = foreign ? ringbtl_add_peer_of_job(m->rt, vpid, (uint64_t) p->proc_name.jobid,
                                                    (uint32_t) p->proc_name.vpid, uris)
                          : ringbtl_add_peer(m->rt, vpid, uris);
        if (RINGBTL_OK != frc) {
            /* A malformed address is reported always; a peer on no interface this
             * process may use (if_include / if_exclude) only when verbose. */
            if (RINGBTL_ERR_UNREACHABLE != frc || verbose > 0) {
                opal_output(0, "btl ringbtl: %s unreachable: address \"%s\": %s (%s)",
                            OPAL_NAME_PRINT(p->proc_name), uris, ringbtl_strerror(frc),
                            ringbtl_last_error());
            }
            free(uris);
            return NULL;
        }
        if (verbose > 1) {
            char shard[48] = "";
            if (m->nshards > 1) {
                snprintf(shard, sizeof(shard), " (shard %u of %u)", m->shard, m->nshards);
            }
            opal_output(0, "btl ringbtl: peer %s at %s%s", OPAL_NAME_PRINT(p->proc_name), uris,
                        shard);
        }
        free(uris);
        ep = calloc(1, sizeof(*ep));
        if (NULL == ep) {
            *rc = OPAL_ERR_OUT_OF_RESOURCE;
            return NULL;
        }
        ep->proc = p;
        ep->peer = vpid;
        m->endpoints[vpid] = ep;
        if (foreign) {
            m->next_foreign++;
        }
    }
    return ep->failed ? NULL : ep;
}

/* Every process but rank 0 reads rank 0's job key from the modex before its first
 * connection (add_procs, an unknown peer, or the first progress, whichever comes first);
 * rank 0 drew it and published it in btl_init. The read waits for rank 0's data. */
int mca_btl_ringbtl_ensure_key(mca_btl_ringbtl_module_t *m)
{
    if (!m->key_pending) {
        return m->key_failed ? OPAL_ERR_NOT_FOUND : OPAL_SUCCESS;
    }
    m->key_pending = false;
    opal_process_name_t root = ringbtl_compat_my_name();
    root.vpid = 0;
    char *key = NULL;
    int rc = ringbtl_compat_modex_recv_string(RINGBTL_MODEX_JOB_KEY, &root, &key);
    if (OPAL_SUCCESS == rc && NULL != key) {
        int frc = ringbtl_set_job_key(m->rt, key);
        memset(key, 0, strlen(key));
        rc = RINGBTL_OK == frc ? OPAL_SUCCESS : OPAL_ERR_BAD_PARAM;
    } else if (OPAL_SUCCESS == rc) {
        rc = OPAL_ERR_NOT_FOUND;
    }
    free(key);
    if (OPAL_SUCCESS != rc) {
        m->key_failed = true;
        opal_output(0, "btl ringbtl: no job key from rank 0 in the modex (%s): connections "
                       "cannot be authenticated, every peer is unreachable over ringbtl (set "
                       "RINGBTL_JOB_KEY or RINGBTL_JOB_KEY_FILE for every process instead)",
                    opal_strerror(rc));
    } else if (mca_btl_ringbtl_component.verbose > 0) {
        opal_output(0, "btl ringbtl: job key of rank 0 read from the modex");
    }
    return rc;
}

static int btl_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                             struct opal_proc_t **procs,
                             struct mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    const opal_proc_t *self = opal_proc_local_get();
    int rc = OPAL_SUCCESS;

    RINGBTL_LOCK(m);
    if (OPAL_SUCCESS != mca_btl_ringbtl_ensure_key(m)) {
        /* Reported once; no peer is reachable without the job's key. */
        RINGBTL_UNLOCK(m);
        return OPAL_SUCCESS;
    }
    for (size_t i = 0; i < nprocs; i++) {
        opal_proc_t *p = procs[i];
        if (p == self) {
            continue;
        }
        /* A process of another job (MPI_Comm_spawn, connect/accept, join): its job's
         * processes connect with the key both jobs derive from each other's public key. */
        if (p->proc_name.jobid != self->proc_name.jobid && !ensure_job(m, p->proc_name.jobid)) {
            continue;
        }
        mca_btl_ringbtl_endpoint_t *ep = add_proc(m, p, &rc);
        if (OPAL_SUCCESS != rc) {
            break;
        }
        if (NULL == ep) {
            continue;
        }
        peers[i] = ep;
        if (NULL != reachable) {
            opal_bitmap_set_bit(reachable, (int) i);
        }
    }
    RINGBTL_UNLOCK(m);
    return rc;
}

/* A process of this job connected that add_procs never saw: ob1 adds remote processes
 * lazily (mpi_add_procs_cutoff), on their first message, so the peer may talk first. As
 * btl tcp does on an unknown incoming connection, find the process (opal_proc_for_name,
 * which creates it from the modex if needed), add it through the add_procs path and
 * accept. ringbtl asks only once the connection passed its handshake checks. */
static int on_unknown_peer(void *ctx, uint32_t peer)
{
    mca_btl_ringbtl_module_t *m = ctx;
    opal_process_name_t name = ringbtl_compat_my_name();
    int rc;

    if (m->closing || (opal_vpid_t) peer == name.vpid
        || OPAL_SUCCESS != mca_btl_ringbtl_ensure_key(m)) {
        return 0;
    }
    name.vpid = (opal_vpid_t) peer;
    opal_proc_t *p = opal_proc_for_name(name);
    if (NULL == p) {
        if (mca_btl_ringbtl_component.verbose > 0) {
            opal_output(0, "btl ringbtl: rank %u connected but is no process of this job: "
                           "refused",
                        (unsigned) peer);
        }
        return 0;
    }
    mca_btl_ringbtl_endpoint_t *ep = add_proc(m, p, &rc);
    if (mca_btl_ringbtl_component.verbose > 1) {
        opal_output(0, "btl ringbtl: %s connected before add_procs: %s",
                    OPAL_NAME_PRINT(name), NULL != ep ? "added" : "unreachable, refused");
    }
    return NULL != ep;
}

/* Endpoints stay allocated until finalize: ringbtl keeps its peer table (and a peer may
 * be added again), and a completion may still name the endpoint. */
static int btl_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                             struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers)
{
    (void) btl;
    (void) nprocs;
    (void) procs;
    (void) peers;
    return OPAL_SUCCESS;
}

static int btl_register_error(struct mca_btl_base_module_t *btl,
                                  mca_btl_base_module_error_cb_fn_t cbfunc)
{
    ((mca_btl_ringbtl_module_t *) btl)->error_cb = cbfunc;
    return OPAL_SUCCESS;
}

/* ---- descriptors ---------------------------------------------------------------------- */

static mca_btl_base_descriptor_t *btl_alloc(struct mca_btl_base_module_t *btl,
                                                struct mca_btl_base_endpoint_t *endpoint,
                                                uint8_t order, size_t size, uint32_t flags)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    (void) order;
    mca_btl_ringbtl_frag_t *f = frag_get(m, size);
    if (NULL == f) {
        return NULL;
    }
    f->ep = endpoint;
    f->base.des_flags = flags;
    return &f->base;
}

static int btl_free(struct mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des)
{
    (void) btl;
    frag_return((mca_btl_ringbtl_frag_t *) des);
    return OPAL_SUCCESS;
}

/* Reserve `reserve` bytes for the caller's header, then the data: contiguous user data is
 * referenced in place (second segment, valid until the completion callback as ob1
 * guarantees); anything else is packed behind the header. */
static mca_btl_base_descriptor_t *btl_prepare_src(struct mca_btl_base_module_t *btl,
                                                      struct mca_btl_base_endpoint_t *endpoint,
                                                      struct opal_convertor_t *convertor,
                                                      uint8_t order, size_t reserve,
                                                      size_t *size, uint32_t flags)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    struct iovec iov;
    uint32_t iov_count = 1;
    size_t max_data = *size;
    mca_btl_ringbtl_frag_t *f;
    (void) order;

    if (reserve > m->super.btl_max_send_size) {
        return NULL;
    }
    if (max_data > m->super.btl_max_send_size - reserve) {
        max_data = m->super.btl_max_send_size - reserve;
    }
    if (0 != max_data && ringbtl_compat_inplace(convertor)) {
        f = frag_get(m, reserve);
        if (NULL == f) {
            return NULL;
        }
        iov.iov_base = NULL;
        iov.iov_len = max_data;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &max_data) < 0) {
            frag_return(f);
            return NULL;
        }
        f->segs[0].seg_len = reserve;
        f->segs[1].seg_addr.pval = iov.iov_base;
        f->segs[1].seg_len = max_data;
        f->base.des_segment_count = 2;
    } else {
        f = frag_get(m, reserve + max_data);
        if (NULL == f) {
            return NULL;
        }
        if (0 != max_data) {
            iov.iov_base = f->buf + reserve;
            iov.iov_len = max_data;
            if (opal_convertor_pack(convertor, &iov, &iov_count, &max_data) < 0) {
                frag_return(f);
                return NULL;
            }
        }
        f->segs[0].seg_len = reserve + max_data;
    }
    *size = max_data;
    f->ep = endpoint;
    f->base.des_flags = flags;
    return &f->base;
}

/* ---- send ----------------------------------------------------------------------------- */

static int frag_send(mca_btl_ringbtl_module_t *m, mca_btl_ringbtl_frag_t *f,
                     mca_btl_base_tag_t tag)
{
    ringbtl_iov_t iov[2];
    size_t n = 0;
    for (size_t i = 0; i < f->base.des_segment_count && i < 2; i++) {
        if (0 == f->segs[i].seg_len && f->base.des_segment_count > 1) {
            continue;
        }
        iov[n].base = f->segs[i].seg_addr.pval;
        iov[n].len = (size_t) f->segs[i].seg_len;
        n++;
    }
    return ringbtl_send(m->rt, f->ep->peer, tag, iov, n, (uint64_t) (uintptr_t) f);
}

/* Hands the queued bytes to the kernel now (ringbtl_flush: no callback runs, so ob1, which
 * is inside its send path, is not re-entered). Without it a process that sends and then
 * blocks outside MPI (MPI_Comm_accept waits in PMIx right after sending its port name;
 * MPI_Comm_connect broadcasts, several sends, and then blocks) would keep the message to
 * itself until its next progress. */
static void flush(mca_btl_ringbtl_module_t *m)
{
    /* The first send since the last progress always goes out; later ones of a burst every
     * flush_batch sends (0, the default: none; 1: all), the rest with the next progress,
     * gathered into one write per peer. */
    const unsigned batch = mca_btl_ringbtl_component.flush_batch;
    const unsigned k = m->sent_since_progress++;
    if (0 != k && (0 == batch || 0 != k % batch)) {
        return;
    }
    (void) ringbtl_flush(m->rt);
}

static int btl_send(struct mca_btl_base_module_t *btl,
                            struct mca_btl_base_endpoint_t *endpoint,
                            struct mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    mca_btl_ringbtl_frag_t *f = (mca_btl_ringbtl_frag_t *) des;
    int rc;

    if (OPAL_UNLIKELY(endpoint->failed)) {
        return OPAL_ERR_UNREACH;
    }
    f->ep = endpoint;
    RINGBTL_LOCK(m);
    rc = frag_send(m, f, tag);
    if (RINGBTL_OK == rc) {
        flush(m);
    }
    RINGBTL_UNLOCK(m);
    /* Accepted: the completion (and des_cbfunc) follows from progress. */
    return status_to_opal(rc);
}

/* Header and data copied into one fragment the BTL owns, then sent: done for the caller.
 * When no fragment fits, the BTL hands back a descriptor (or none) per the contract. */
#ifdef RINGBTL_TSAN_PROBE
/* Built only by tools/ompi-ci.sh's probe of its ThreadSanitizer run: a count every sending
 * thread bumps without a lock, a race the run must report. */
unsigned long ringbtl_tsan_probe;
#endif

static int btl_sendi(struct mca_btl_base_module_t *btl,
                         struct mca_btl_base_endpoint_t *endpoint,
                         struct opal_convertor_t *convertor, void *header, size_t header_size,
                         size_t payload_size, uint8_t order, uint32_t flags,
                         mca_btl_base_tag_t tag, mca_btl_base_descriptor_t **descriptor)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    const size_t total = header_size + payload_size;
#ifdef RINGBTL_TSAN_PROBE
    ringbtl_tsan_probe++;
#endif
    mca_btl_ringbtl_frag_t *f;
    int rc;

    if (OPAL_UNLIKELY(endpoint->failed)) {
        if (NULL != descriptor) {
            *descriptor = NULL;
        }
        return OPAL_ERR_UNREACH;
    }
    if (OPAL_UNLIKELY(total > m->super.btl_eager_limit)
        || NULL == (f = frag_get(m, total))) {
        if (NULL != descriptor) {
            *descriptor = btl_alloc(btl, endpoint, order, total, flags);
        }
        return OPAL_ERR_RESOURCE_BUSY;
    }
    memcpy(f->buf, header, header_size);
    if (0 != payload_size) {
        struct iovec iov = {.iov_base = f->buf + header_size, .iov_len = payload_size};
        uint32_t iov_count = 1;
        size_t max_data = payload_size;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &max_data) < 0
            || max_data != payload_size) {
            frag_return(f);
            if (NULL != descriptor) {
                *descriptor = NULL;
            }
            return OPAL_ERROR;
        }
    }
    f->ep = endpoint;
    f->base.des_flags = MCA_BTL_DES_FLAGS_BTL_OWNERSHIP;
    RINGBTL_LOCK(m);
    rc = frag_send(m, f, tag);
    if (RINGBTL_OK == rc) {
        flush(m);
    }
    RINGBTL_UNLOCK(m);
    if (RINGBTL_OK != rc) {
        frag_return(f);
        if (NULL != descriptor) {
            *descriptor = NULL;
        }
        return status_to_opal(rc);
    }
    return OPAL_SUCCESS;
}

/* ---- put and registration ------------------------------------------------------------ */

/* Registered memory becomes a ringbtl region with what the flags let peers do: remote
 * write, their puts (checked against it, their bytes going from the socket straight into
 * it); remote read, their gets (the reply's bytes read straight from it); neither, only the
 * replies of our own gets (ob1 registers a receive buffer for local write before it gets
 * into it). ob1 registers each pipeline fragment of a large receive buffer (remote write),
 * sends its handle to the sender, and deregisters it when the sender's FIN for that
 * fragment arrives, which ringbtl delivers only after the put's data (frames to one peer
 * keep their order). For the RDMA-read protocol the sender registers its buffer for
 * remote read and deregisters it at the receiver's FIN, which follows the get's reply. */
static mca_btl_base_registration_handle_t *btl_register_mem(struct mca_btl_base_module_t *btl,
                                                           struct mca_btl_base_endpoint_t *ep,
                                                           void *base, size_t size,
                                                           uint32_t flags)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    mca_btl_base_registration_handle_t *h = malloc(sizeof(*h));
    (void) ep;
    if (NULL == h) {
        return NULL;
    }
    h->key = RINGBTL_NO_REGION;
    uint32_t access = 0;
    if (flags & MCA_BTL_REG_FLAG_REMOTE_WRITE) {
        access |= RINGBTL_REGION_PEER_WRITE;
    }
    if (flags & MCA_BTL_REG_FLAG_REMOTE_READ) {
        access |= RINGBTL_REGION_PEER_READ;
    }
    if (0 == access && 0 == (flags & MCA_BTL_REG_FLAG_LOCAL_WRITE)) {
        return h;
    }
    RINGBTL_LOCK(m);
    const int rc = ringbtl_register_region(m->rt, base, size, access, &h->key);
    if (RINGBTL_OK == rc) {
        m->regions_registered++;
    }
    RINGBTL_UNLOCK(m);
    if (RINGBTL_OK != rc) {
        if (mca_btl_ringbtl_component.verbose > 0) {
            opal_output(0, "btl ringbtl: %zu bytes at %p not registered: %s", size, base,
                        ringbtl_last_error());
        }
        free(h);
        return NULL;
    }
    return h;
}

/* Refused by ringbtl while a put is being received into the region, which ob1's order
 * (deregistration after the FIN that follows the data) rules out, or while the reply to a
 * peer's get still holds it: the FIN that releases it follows the reply's bytes, but the
 * completion of the reply's send may not be reaped yet. Outside progress, progress lets
 * either finish, for a bounded time. Inside a progress callback the region is taken back
 * after that progress (mca_btl_ringbtl_release_pending): its bytes have reached the peer,
 * so nothing reads them again. A region that stays busy stays registered (its memory must
 * then not be reused, which is reported). */
static int btl_deregister_mem(struct mca_btl_base_module_t *btl,
                              mca_btl_base_registration_handle_t *h)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    int rc = RINGBTL_OK;
    if (RINGBTL_NO_REGION != h->key) {
        RINGBTL_LOCK(m);
        const double deadline = now_s() + mca_btl_ringbtl_component.finalize_timeout_ms / 1e3;
        while (RINGBTL_ERR_BUSY == (rc = ringbtl_deregister_region(m->rt, h->key))
               && !m->progressing && now_s() < deadline) {
            (void) ringbtl_progress(m->rt);
            if (OPAL_UNLIKELY(m->nheld > 0)) {
                mca_btl_ringbtl_release_held(m);
            }
        }
        if (RINGBTL_ERR_BUSY == rc && m->progressing) {
            if (m->nreleased == m->released_cap) {
                const size_t cap = m->released_cap ? 2 * m->released_cap : 16;
                uint64_t *r = realloc(m->released, cap * sizeof(*r));
                if (NULL != r) {
                    m->released = r;
                    m->released_cap = cap;
                }
            }
            if (m->nreleased < m->released_cap) {
                m->released[m->nreleased++] = h->key;
                rc = RINGBTL_OK;
            }
        }
        RINGBTL_UNLOCK(m);
        if (RINGBTL_OK != rc) {
            opal_output(0, "btl ringbtl: a registration could not be released: %s",
                        ringbtl_last_error());
            return OPAL_ERROR;
        }
    }
    free(h);
    return OPAL_SUCCESS;
}

/* Takes back the regions released inside a progress callback (btl_deregister_mem), now
 * that the progress is over; those still busy wait for the next one. Under the lock. */
void mca_btl_ringbtl_release_pending(mca_btl_ringbtl_module_t *m)
{
    size_t kept = 0;
    for (size_t i = 0; i < m->nreleased; i++) {
        if (RINGBTL_ERR_BUSY == ringbtl_deregister_region(m->rt, m->released[i])) {
            m->released[kept++] = m->released[i];
        }
    }
    m->nreleased = kept;
}

/* One ringbtl put (`get` false) or get: the checks, the descriptor that completes it
 * (cbfunc, exactly once), the call, and the flush that sends it on its way. */
static int rdma(mca_btl_ringbtl_module_t *m, bool get, struct mca_btl_base_endpoint_t *endpoint,
                void *local_address, uint64_t remote_address,
                struct mca_btl_base_registration_handle_t *local_handle,
                struct mca_btl_base_registration_handle_t *remote_handle, size_t size,
                mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    if (OPAL_UNLIKELY(endpoint->failed)) {
        return OPAL_ERR_UNREACH;
    }
    /* A get's reply lands in a region of ours; a put's source needs none. */
    if (OPAL_UNLIKELY(NULL == remote_handle || RINGBTL_NO_REGION == remote_handle->key ||
                      (get && (NULL == local_handle || RINGBTL_NO_REGION == local_handle->key)))) {
        return OPAL_ERR_BAD_PARAM;
    }
    if (OPAL_UNLIKELY(size > (get ? m->super.btl_get_limit : m->super.btl_put_limit))) {
        return OPAL_ERR_NOT_AVAILABLE;
    }
    mca_btl_ringbtl_put_t *p = (mca_btl_ringbtl_put_t *) ringbtl_pool_get(&m->puts);
    if (OPAL_UNLIKELY(NULL == p)) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    p->ep = endpoint;
    p->local_address = local_address;
    p->local_handle = local_handle;
    p->cbfunc = cbfunc;
    p->cbcontext = cbcontext;
    p->cbdata = cbdata;
    const uint64_t cookie = (uint64_t) (uintptr_t) p | PUT_COOKIE;
    ringbtl_iov_t iov = {.base = local_address, .len = size};
    RINGBTL_LOCK(m);
    const int rc = get ? ringbtl_get(m->rt, endpoint->peer, remote_handle->key, remote_address,
                                     (uint32_t) size, local_handle->key,
                                     (uint64_t) (uintptr_t) local_address, cookie)
                       : ringbtl_put(m->rt, endpoint->peer, remote_handle->key, remote_address,
                                     &iov, 1, cookie);
    if (RINGBTL_OK == rc) {
        if (get) {
            m->gets_sent++;
        } else {
            m->puts_sent++;
        }
        flush(m);
    }
    RINGBTL_UNLOCK(m);
    if (RINGBTL_OK != rc) {
        ringbtl_pool_return(&m->puts, &p->super);
        return status_to_opal(rc);
    }
    return OPAL_SUCCESS;
}

/* One ringbtl put: the peer's kernel writes the bytes straight into the registered
 * buffer. Completes (cbfunc) once the data is in our kernel, like a send. */
static int btl_put(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                   void *local_address, uint64_t remote_address,
                   struct mca_btl_base_registration_handle_t *local_handle,
                   struct mca_btl_base_registration_handle_t *remote_handle, size_t size,
                   int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                   void *cbcontext, void *cbdata)
{
    (void) flags;
    (void) order;
    return rdma((mca_btl_ringbtl_module_t *) btl, false, endpoint, local_address,
                remote_address, local_handle, remote_handle, size, cbfunc, cbcontext, cbdata);
}

/* One ringbtl get: the peer reads its registered buffer straight into its socket, and our
 * kernel writes the bytes straight into ours. Completes (cbfunc) once they are in place. */
static int btl_get(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                   void *local_address, uint64_t remote_address,
                   struct mca_btl_base_registration_handle_t *local_handle,
                   struct mca_btl_base_registration_handle_t *remote_handle, size_t size,
                   int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                   void *cbcontext, void *cbdata)
{
    (void) flags;
    (void) order;
    return rdma((mca_btl_ringbtl_module_t *) btl, true, endpoint, local_address, remote_address,
                local_handle, remote_handle, size, cbfunc, cbcontext, cbdata);
}

/* ---- blocking outside MPI ------------------------------------------------------------- */

/* A send may wait in ringbtl's queue until the next progress (btl_ringbtl_flush_batch), so
 * that a burst leaves gathered; and a send to a peer not connected yet needs progress to
 * finish the connection (connect, handshake) before its bytes can leave. Open MPI itself
 * blocks outside progress in some PMIx calls right after sending: MPI_Comm_connect's root
 * broadcasts the port data to its group, often over new connections, and then waits in
 * PMIx_Connect, which the others reach only once they have that data. Every blocking PMIx
 * call of the client API that Open MPI makes after start-up (fence, connect, disconnect,
 * publish, lookup, unpublish, spawn) therefore first progresses ringbtl until every send
 * accepted so far has left (at most btl_ringbtl_block_flush_ms): in Open MPI 4.1 the
 * entries of opal_pmix (its table of PMIx functions) are wrapped while the module lives,
 * and put back at finalize (ringbtl_compat_wrap_blocking). Open MPI 5.0 calls PMIx
 * directly: there, nothing is wrapped. */

/* Sends accepted and not completed yet, over every peer. */
static size_t unsent(mca_btl_ringbtl_module_t *m)
{
    size_t n = 0;
    for (uint32_t i = 0; i < m->nendpoints; i++) {
        if (NULL != m->endpoints[i]) {
            n += ringbtl_pending(m->rt, i);
        }
    }
    return n;
}

static void flush_module_before_blocking(mca_btl_ringbtl_module_t *m)
{
    RINGBTL_LOCK(m);
    if (NULL != m->rt && !m->closing) {
        if (m->progressing) {
            /* Called back from inside ringbtl's progress: no pass can run here. */
            (void) ringbtl_flush(m->rt);
        } else {
            const double end = now_s() + mca_btl_ringbtl_component.block_flush_ms / 1e3;
            m->progressing = true;
            while (unsent(m) > 0 && now_s() < end) {
                m->sent_since_progress = 0;
                (void) ringbtl_progress(m->rt);
            }
            m->progressing = false;
            if (m->nheld > 0) {
                mca_btl_ringbtl_release_held(m);
            }
            if (m->nreleased > 0) {
                mca_btl_ringbtl_release_pending(m);
            }
            (void) ringbtl_flush(m->rt);
        }
    }
    RINGBTL_UNLOCK(m);
}

static void flush_before_blocking(void)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    for (unsigned i = 0; i < c->nmodules; i++) {
        if (NULL != c->modules[i]) {
            flush_module_before_blocking(c->modules[i]);
        }
    }
}

/* ---- finalize ------------------------------------------------------------------------- */

static int btl_finalize(struct mca_btl_base_module_t *btl)
{
    mca_btl_ringbtl_module_t *m = (mca_btl_ringbtl_module_t *) btl;
    int rc;

    if (NULL == m->rt) {
        return OPAL_SUCCESS;
    }
    /* No progress but the program's from here on. */
    mca_btl_ringbtl_progress_thread_stop();
    RINGBTL_LOCK(m);
    /* The upper layers are gone: from here completions only recycle fragments and peer
     * failures are no longer reported. */
    m->closing = true;
    m->error_cb = NULL;
    /* Held completions only recycle their fragments now. */
    mca_btl_ringbtl_release_held(m);
    ringbtl_compat_wrap_blocking(false, NULL);
    if (mca_btl_ringbtl_component.verbose > 0) {
        opal_output(0, "btl ringbtl: received %llu frames, %llu bytes; copied for alignment: "
                       "%llu frames, %llu bytes",
                    (unsigned long long) m->rx_frames, (unsigned long long) m->rx_bytes,
                    (unsigned long long) m->rx_copied_frames,
                    (unsigned long long) m->rx_copied_bytes);
        opal_output(0, "btl ringbtl: puts sent %llu; gets sent %llu; regions registered %llu",
                    (unsigned long long) m->puts_sent, (unsigned long long) m->gets_sent,
                    (unsigned long long) m->regions_registered);
        ringbtl_link_stats_t ls;
        if (RINGBTL_OK == ringbtl_link_stats(m->rt, &ls)) {
            opal_output(0, "btl ringbtl: links joined %llu, lost %llu; failovers %llu, "
                           "after a stall %llu",
                        (unsigned long long) ls.joined, (unsigned long long) ls.lost,
                        (unsigned long long) ls.failovers, (unsigned long long) ls.stalls);
        }
    }
    rc = ringbtl_destroy(m->rt, mca_btl_ringbtl_component.finalize_timeout_ms);
    free(m->released);
    m->released = NULL;
    m->nreleased = m->released_cap = 0;
    free(m->held);
    m->held = NULL;
    m->nheld = m->held_cap = 0;
    if (RINGBTL_OK != rc && mca_btl_ringbtl_component.verbose > 0) {
        opal_output(0, "btl ringbtl: shutdown: %s (%s)", ringbtl_strerror(rc),
                    ringbtl_last_error());
    }
    m->rt = NULL;
    RINGBTL_UNLOCK(m);
    for (uint32_t i = 0; i < m->nendpoints; i++) {
        free(m->endpoints[i]);
    }
    free(m->endpoints);
    m->endpoints = NULL;
    m->nendpoints = 0;
    free(m->jobs);
    m->jobs = NULL;
    m->njobs = 0;
    free(m->scratch);
    m->scratch = NULL;
    m->scratch_len = 0;
    ringbtl_pool_destruct(&m->eager_frags);
    ringbtl_pool_destruct(&m->max_frags);
    ringbtl_pool_destruct(&m->puts);
    if (m->threads) {
        pthread_mutex_destroy(&m->lock);
    }
    /* Progress and the flush before blocking skip it from now on. */
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    for (unsigned i = 0; i < c->nmodules; i++) {
        if (c->modules[i] == m) {
            c->modules[i] = NULL;
        }
    }
    if (m != &mca_btl_ringbtl_module) {
        /* A module per interface: a copy btl_init allocated. */
        free(m);
    }
    return OPAL_SUCCESS;
}

/* ---- module --------------------------------------------------------------------------- */

mca_btl_ringbtl_module_t mca_btl_ringbtl_module = {
    .super =
        {
            .btl_component = &mca_btl_ringbtl_component.super,
            .btl_add_procs = btl_add_procs,
            .btl_del_procs = btl_del_procs,
            .btl_finalize = btl_finalize,
            .btl_alloc = btl_alloc,
            .btl_free = btl_free,
            .btl_prepare_src = btl_prepare_src,
            .btl_send = btl_send,
            .btl_sendi = btl_sendi,
            .btl_put = btl_put,
            .btl_get = btl_get,
            .btl_register_mem = btl_register_mem,
            .btl_deregister_mem = btl_deregister_mem,
            .btl_register_error = btl_register_error,
        },
};

int mca_btl_ringbtl_module_init(mca_btl_ringbtl_module_t *m, ringbtl_t *rt, bool threads)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    const size_t frame = ringbtl_max_frame(rt);
    int rc;

    /* ob1 puts its header inside the BTL's fragment: every fragment is one ringbtl frame. */
    if (m->super.btl_max_send_size > frame) {
        opal_output(0, "btl ringbtl: btl_ringbtl_max_send_size %zu above ringbtl's max frame "
                       "%zu: lowered",
                    m->super.btl_max_send_size, frame);
        m->super.btl_max_send_size = frame;
    }
    if (m->super.btl_eager_limit > m->super.btl_max_send_size) {
        m->super.btl_eager_limit = m->super.btl_max_send_size;
    }
    if (m->super.btl_rndv_eager_limit > m->super.btl_eager_limit) {
        m->super.btl_rndv_eager_limit = m->super.btl_eager_limit;
    }
    /* A put is one ringbtl frame: its data and the 16-byte target. */
    if (m->super.btl_put_limit > frame - 16) {
        m->super.btl_put_limit = frame - 16;
    }
    /* A get's reply is one ringbtl frame, shaped as a put. */
    if (m->super.btl_get_limit > frame - 16) {
        m->super.btl_get_limit = frame - 16;
    }
    if (m->super.btl_rdma_pipeline_frag_size > m->super.btl_put_limit) {
        m->super.btl_rdma_pipeline_frag_size = m->super.btl_put_limit;
    }

    m->rt = rt;
    m->closing = false;
    m->error_cb = NULL;
    m->endpoints = NULL;
    m->nendpoints = 0;
    m->foreign_base = m->next_foreign = 0;
    m->jobs = NULL;
    m->njobs = 0;
    m->scratch = NULL;
    m->scratch_len = 0;
    m->rx_frames = m->rx_bytes = m->rx_copied_frames = m->rx_copied_bytes = 0;
    m->sent_since_progress = 0;
    m->progressing = false;
    m->puts_sent = m->gets_sent = m->regions_registered = 0;
    m->released = NULL;
    m->nreleased = m->released_cap = 0;
    m->held = NULL;
    m->nheld = m->held_cap = 0;
    /* key_pending / key_failed are set by btl_init before this. */
    m->threads = threads;
    if (threads) {
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&m->lock, &attr);
        pthread_mutexattr_destroy(&attr);
    }

    ringbtl_pool_construct(&m->eager_frags);
    ringbtl_pool_construct(&m->max_frags);
    ringbtl_pool_construct(&m->puts);
    rc = ringbtl_pool_init(&m->eager_frags,
                           sizeof(mca_btl_ringbtl_frag_t) + m->super.btl_eager_limit,
                           OBJ_CLASS(mca_btl_ringbtl_frag_t), c->free_list_num,
                           c->free_list_max, c->free_list_inc, eager_item_init, m);
    if (OPAL_SUCCESS == rc) {
        rc = ringbtl_pool_init(&m->max_frags,
                               sizeof(mca_btl_ringbtl_frag_t) + m->super.btl_max_send_size,
                               OBJ_CLASS(mca_btl_ringbtl_frag_t), c->free_list_num,
                               c->free_list_max, c->free_list_inc, max_item_init, m);
    }
    if (OPAL_SUCCESS == rc) {
        rc = ringbtl_pool_init(&m->puts, sizeof(mca_btl_ringbtl_put_t),
                               OBJ_CLASS(mca_btl_ringbtl_put_t), c->free_list_num,
                               c->free_list_max, c->free_list_inc, NULL, NULL);
    }
    if (OPAL_SUCCESS != rc) {
        opal_output(0, "btl ringbtl: fragment lists not created (%d)", rc);
        ringbtl_pool_destruct(&m->eager_frags);
        ringbtl_pool_destruct(&m->max_frags);
        ringbtl_pool_destruct(&m->puts);
        m->rt = NULL;
        return rc;
    }

    for (unsigned tag = 0; tag < MCA_BTL_TAG_MAX; tag++) {
        rc = ringbtl_register(rt, (uint8_t) tag, on_recv, m);
        if (RINGBTL_OK != rc) {
            opal_output(0, "btl ringbtl: tag %u not registered: %s", tag, ringbtl_strerror(rc));
        }
    }
    ringbtl_on_complete(rt, on_complete, m);
    ringbtl_on_error(rt, on_error, m);
    ringbtl_on_unknown_peer(rt, on_unknown_peer, m);
    ringbtl_compat_wrap_blocking(true, flush_before_blocking);
    return OPAL_SUCCESS;
}
