/*
 * mca_btl_ringbtl component: MCA parameters, version check, module creation (btl_init),
 * progress.
 */
#include "btl_ringbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int component_register(void);
static int component_open(void);
static int component_close(void);
static mca_btl_base_module_t **component_init(int *num_btls, bool enable_progress_threads,
                                            bool enable_mpi_threads);

/* The transport settings exposed as btl_ringbtl_<name>. Values are passed verbatim to
 * ringbtl_config_set, which applies the same parsing and range checks as the RINGBTL_*
 * environment variables; unset ones keep ringbtl's default (or the environment's). */
static mca_btl_ringbtl_setting_t ringbtl_settings[] = {
    {"backend", "RINGBTL_BACKEND",
     "I/O backend: auto (io_uring when the kernel allows it, else epoll), uring, epoll. "
     "Under MPI_THREAD_MULTIPLE the component uses epoll (an io_uring ring is driven by "
     "the thread that created it)",
     NULL},
    {"progress", "RINGBTL_PROGRESS",
     "How ringbtl waits inside its own progress: poll (default), block, spin[:USECS]", NULL},
    {"listen", "RINGBTL_LISTEN",
     "Where to listen: auto (default here: every usable interface, after if_include / "
     "if_exclude, published through the modex) or one ip:port",
     NULL},
    {"if_include", "RINGBTL_IF_INCLUDE",
     "Comma-separated interfaces (names, or CIDR subnets of either family: fd00::/64 for "
     "IPv6 only) to listen and connect on", NULL},
    {"if_exclude", "RINGBTL_IF_EXCLUDE",
     "Comma-separated interfaces (names or CIDR subnets) not to use", NULL},
    {"links", "RINGBTL_LINKS",
     "Connections to a peer per pair of interfaces on one subnet (1-8, 8 in all; as "
     "btl_tcp_links)",
     NULL},
    {"port", "RINGBTL_PORT", "Listen port or range (40000 or 40000-40100); default: any",
     NULL},
    {"max_frame", "RINGBTL_MAX_FRAME",
     "Largest message in bytes accepted from a peer (default 64 MiB); must be at least "
     "btl_ringbtl_max_send_size plus ob1's header",
     NULL},
    {"recv_cache", "RINGBTL_RECV_CACHE",
     "Receive cache per connection in bytes (4 KiB..64 MiB, default 64 KiB)", NULL},
    {"sndbuf", "RINGBTL_SNDBUF", "SO_SNDBUF in bytes (0 = kernel autotuning)", NULL},
    {"rcvbuf", "RINGBTL_RCVBUF", "SO_RCVBUF in bytes (0 = kernel autotuning)", NULL},
    {"tcp_congestion", "RINGBTL_TCP_CONGESTION",
     "TCP congestion control: auto, system, or an algorithm name", NULL},
    {"connect_retries", "RINGBTL_CONNECT_RETRIES",
     "Connect attempts before a peer is declared unreachable", NULL},
    {"handshake_timeout_ms", "RINGBTL_HANDSHAKE_TIMEOUT_MS",
     "Time allowed for a connection's handshake (connect timeout), ms", NULL},
    {"tcp_user_timeout_ms", "RINGBTL_TCP_USER_TIMEOUT_MS",
     "TCP_USER_TIMEOUT of connections in ms (0 = system default)", NULL},
    {"keepalive", "RINGBTL_KEEPALIVE", "TCP keepalive idle_s,intvl_s,cnt (0 = off)", NULL},
    {"zerocopy", "RINGBTL_ZEROCOPY",
     "Zero-copy (MSG_ZEROCOPY) sends from this many bytes (0 = off)", NULL},
    {"recv_multishot", "RINGBTL_RECV_MULTISHOT",
     "io_uring multishot receive with provided buffers (0/1)", NULL},
    {"job_token", "RINGBTL_JOB_TOKEN",
     "Job token both ends of a connection must agree on (default: derived from the jobid)",
     NULL},
    {NULL, NULL, NULL, NULL},
};

mca_btl_ringbtl_component_t mca_btl_ringbtl_component = {
    .super =
        {
            .btl_version =
                {
                    MCA_BTL_DEFAULT_VERSION("ringbtl"),
                    .mca_open_component = component_open,
                    .mca_close_component = component_close,
                    .mca_register_component_params = component_register,
                },
            .btl_data =
                {
                    .param_field = MCA_BASE_METADATA_PARAM_NONE,
                },
            .btl_init = component_init,
            .btl_progress = mca_btl_ringbtl_progress,
        },
    .verbose = 0,
    .free_list_num = 8,
    .free_list_max = -1,
    .free_list_inc = 32,
    .finalize_timeout_ms = 2000,
    .flush_batch = 0,
    .block_flush_ms = 2000,
    .settings = ringbtl_settings,
};

/* Defaults of the standard BTL parameters (btl_ringbtl_eager_limit, ...), from runs of
 * tools/ompi-compare.sh --only ringbtl --ringbtl-mca "btl_ringbtl_eager_limit N ...":
 * an eager limit of 128 KiB sends a 64 KiB message (plus ob1's header) eagerly, where btl
 * tcp's 64 KiB limit makes it a rendezvous (a round trip more), and raised the 64 KiB
 * window bandwidth by 20-30 %; 1 MiB fragments for the rendezvous data (the frames are
 * sent from the user's buffer when it is contiguous). Latency and bandwidth rank ringbtl
 * above btl tcp (latency 100, bandwidth 100) for ob1's scheduling. */
#define RINGBTL_DEFAULT_EAGER_LIMIT (128 * 1024)
#define RINGBTL_DEFAULT_MAX_SEND (1024 * 1024)
/* Large messages: after the rendezvous, this much goes as messages, the rest as puts of
 * at most RINGBTL_DEFAULT_PUT_FRAG bytes straight into the receiver's buffer. */
#define RINGBTL_DEFAULT_PIPELINE_SEND (128 * 1024)
#define RINGBTL_DEFAULT_PUT_FRAG (4 * 1024 * 1024)
#define RINGBTL_DEFAULT_LATENCY 90
#define RINGBTL_DEFAULT_BANDWIDTH 10000

static int component_register(void)
{
    mca_base_component_t *c = &mca_btl_ringbtl_component.super.btl_version;

    /* The running Open MPI must be the one the component was built for (in 5.0 also the
     * layouts it shares with it); otherwise it declines, having said what differs. */
    if (!ringbtl_compat_check()) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (ringbtl_abi_version() != RINGBTL_ABI_VERSION) {
        opal_output(0, "btl ringbtl: library ABI %u, header ABI %u: declining",
                    ringbtl_abi_version(), (unsigned) RINGBTL_ABI_VERSION);
        return OPAL_ERR_NOT_SUPPORTED;
    }

    (void) mca_base_component_var_register(
        c, "verbose", "Verbosity of the ringbtl BTL (0 = quiet, 1 = set-up, 2 = peers)",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_LOCAL,
        &mca_btl_ringbtl_component.verbose);
    (void) mca_base_component_var_register(
        c, "free_list_num", "Send fragments allocated per free list at start-up",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_9, MCA_BASE_VAR_SCOPE_READONLY,
        &mca_btl_ringbtl_component.free_list_num);
    (void) mca_base_component_var_register(
        c, "free_list_max", "Most send fragments per free list (-1 = no limit)",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_9, MCA_BASE_VAR_SCOPE_READONLY,
        &mca_btl_ringbtl_component.free_list_max);
    (void) mca_base_component_var_register(
        c, "free_list_inc", "Send fragments added to a free list when it runs empty",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_9, MCA_BASE_VAR_SCOPE_READONLY,
        &mca_btl_ringbtl_component.free_list_inc);
    (void) mca_base_component_var_register(
        c, "finalize_timeout_ms",
        "At finalize, time allowed to send FIN to every peer and drain pending sends (ms)",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_5,
        MCA_BASE_VAR_SCOPE_READONLY, &mca_btl_ringbtl_component.finalize_timeout_ms);

    (void) mca_base_component_var_register(
        c, "flush_batch",
        "A send hands its bytes to the kernel at once when it is the first since the last "
        "progress and, when this is N > 0, every N-th after it; the others leave together "
        "at the next progress, gathered into one write per peer. 0 (default): only the "
        "first, the highest message rate; 1: every send at once, like btl tcp (for a "
        "program that sends several messages and then blocks outside MPI waiting for their "
        "receivers; Open MPI's own such waits, in PMIx, are covered by "
        "btl_ringbtl_block_flush_ms)",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_5,
        MCA_BASE_VAR_SCOPE_READONLY, &mca_btl_ringbtl_component.flush_batch);

    (void) mca_base_component_var_register(
        c, "block_flush_ms",
        "Before Open MPI blocks in PMIx (fence, connect, disconnect, publish, lookup, "
        "unpublish, spawn: MPI_Comm_connect/accept/spawn, MPI_Publish_name, ...), ringbtl is "
        "progressed until every send accepted so far has left, connections included, for at "
        "most this long (ms)",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_5,
        MCA_BASE_VAR_SCOPE_READONLY, &mca_btl_ringbtl_component.block_flush_ms);

    for (mca_btl_ringbtl_setting_t *s = ringbtl_settings; s->mca != NULL; s++) {
        char help[512];
        snprintf(help, sizeof(help), "%s (ringbtl setting %s; unset = ringbtl's default)",
                 s->help, s->env);
        s->value = NULL;
        (void) mca_base_component_var_register(c, s->mca, help, MCA_BASE_VAR_TYPE_STRING,
                                               NULL, 0, 0, OPAL_INFO_LVL_4,
                                               MCA_BASE_VAR_SCOPE_READONLY, &s->value);
    }

    mca_btl_base_module_t *b = &mca_btl_ringbtl_module.super;
    b->btl_exclusivity = MCA_BTL_EXCLUSIVITY_LOW + 100;
    b->btl_eager_limit = RINGBTL_DEFAULT_EAGER_LIMIT;
    b->btl_rndv_eager_limit = RINGBTL_DEFAULT_EAGER_LIMIT;
    b->btl_max_send_size = RINGBTL_DEFAULT_MAX_SEND;
    b->btl_rdma_pipeline_send_length = RINGBTL_DEFAULT_PIPELINE_SEND;
    b->btl_rdma_pipeline_frag_size = RINGBTL_DEFAULT_PUT_FRAG;
    b->btl_min_rdma_pipeline_size = 0;
    /* btl_get is there (btl_ringbtl_flags send,put,get,inplace); ob1 reads large messages
     * with it when offered, which measured no better than put (docs/design/large-messages.md). */
    b->btl_flags = MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_SEND_INPLACE | MCA_BTL_FLAGS_PUT;
    b->btl_registration_handle_size = sizeof(mca_btl_base_registration_handle_t);
    b->btl_put_limit = SIZE_MAX;     /* lowered to ringbtl's max frame at init */
    b->btl_get_limit = SIZE_MAX;     /* likewise */
    b->btl_get_alignment = 0;
    /* A get's reply lands in a region: the destination is always registered. */
    b->btl_get_local_registration_threshold = 0;
    b->btl_put_alignment = 0;
    b->btl_put_local_registration_threshold = SIZE_MAX; /* the source needs none */
    b->btl_latency = RINGBTL_DEFAULT_LATENCY;
    b->btl_bandwidth = RINGBTL_DEFAULT_BANDWIDTH;
    return mca_btl_base_param_register(c, b);
}

static int component_open(void)
{
    return ringbtl_compat_check() ? OPAL_SUCCESS : OPAL_ERR_NOT_SUPPORTED;
}

static int component_close(void)
{
    ringbtl_compat_fini();
    return OPAL_SUCCESS;
}

static int component_set(ringbtl_config_t *cfg, const char *what, const char *name,
                       const char *value)
{
    int rc = ringbtl_config_set(cfg, name, value);
    if (RINGBTL_OK != rc) {
        opal_output(0, "btl ringbtl: %s=%s rejected: %s; the component declines", what, value,
                    ringbtl_last_error());
    }
    return rc;
}

static mca_btl_base_module_t **component_init(int *num_btls, bool enable_progress_threads,
                                            bool enable_mpi_threads)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    ringbtl_config_t *cfg = NULL;
    ringbtl_t *rt = NULL;
    const char *backend = NULL;
    char token[32];
    int rc;

    (void) enable_progress_threads;
    *num_btls = 0;
    if (!ringbtl_compat_check()) {
        return NULL;
    }

    const opal_process_name_t me = ringbtl_compat_my_name();
    rc = ringbtl_config_new((uint32_t) me.vpid, &cfg);
    if (RINGBTL_OK != rc) {
        opal_output(0, "btl ringbtl: no configuration: %s", ringbtl_last_error());
        return NULL;
    }
    rc = ringbtl_config_from_env(cfg);
    if (RINGBTL_OK != rc) {
        opal_output(0, "btl ringbtl: RINGBTL_* environment rejected: %s; declining",
                    ringbtl_last_error());
        goto fail;
    }
    /* Connections of this job only: both ends derive the token from the jobid. */
    if (NULL == getenv("RINGBTL_JOB_TOKEN")) {
        snprintf(token, sizeof(token), "%u", (unsigned) me.jobid);
        (void) ringbtl_config_set(cfg, "RINGBTL_JOB_TOKEN", token);
    }
    /* The job key, with no user configuration: rank 0 draws one and publishes it through
     * the modex; the others read it before their first connection
     * (mca_btl_ringbtl_ensure_key). A key the user gave (RINGBTL_JOB_KEY or
     * RINGBTL_JOB_KEY_FILE, the same for every process) takes precedence. */
    bool key_pending = false;
    if (NULL == getenv("RINGBTL_JOB_KEY") && NULL == getenv("RINGBTL_JOB_KEY_FILE")) {
        if (0 == me.vpid) {
            char key[65];
            rc = ringbtl_generate_job_key(key);
            if (RINGBTL_OK == rc) {
                rc = ringbtl_compat_modex_send_string(RINGBTL_MODEX_JOB_KEY, key);
                if (OPAL_SUCCESS == rc) {
                    rc = ringbtl_config_set(cfg, "RINGBTL_JOB_KEY", key) == RINGBTL_OK
                             ? OPAL_SUCCESS
                             : OPAL_ERROR;
                }
            }
            memset(key, 0, sizeof(key));
            if (OPAL_SUCCESS != rc) {
                opal_output(0, "btl ringbtl: no job key published (%d: %s); declining", rc,
                            ringbtl_last_error());
                goto fail;
            }
        } else {
            key_pending = true;
        }
    }
    /* ringbtl's own default listens on 127.0.0.1; an MPI job may span hosts. */
    if (NULL == getenv("RINGBTL_LISTEN")
        && RINGBTL_OK != component_set(cfg, "listen default", "RINGBTL_LISTEN", "auto")) {
        goto fail;
    }
    for (mca_btl_ringbtl_setting_t *s = c->settings; s->mca != NULL; s++) {
        if (NULL == s->value || '\0' == s->value[0]) {
            continue;
        }
        char what[64];
        snprintf(what, sizeof(what), "btl_ringbtl_%s", s->mca);
        if (RINGBTL_OK != component_set(cfg, what, s->env, s->value)) {
            goto fail;
        }
        if (0 == strcmp(s->mca, "backend")) {
            backend = s->value;
        }
    }
    if (NULL == backend) {
        backend = getenv("RINGBTL_BACKEND");
    }
    if (enable_mpi_threads) {
        /* MPI_THREAD_MULTIPLE: several threads may enter the BTL. The module serialises
         * them behind a lock; io_uring's ring (SINGLE_ISSUER) must stay on the thread that
         * created it, so the epoll backend drives the transport. */
        if (NULL != backend && 0 == strcmp(backend, "uring")) {
            opal_output(0, "btl ringbtl: btl_ringbtl_backend=uring cannot serve "
                           "MPI_THREAD_MULTIPLE (the io_uring ring is bound to the thread "
                           "that created it); the component declines. Use backend auto or "
                           "epoll.");
            goto fail;
        }
        if (RINGBTL_OK != component_set(cfg, "MPI_THREAD_MULTIPLE", "RINGBTL_BACKEND", "epoll")) {
            goto fail;
        }
    }

    rc = ringbtl_create(cfg, &rt);
    cfg = NULL; /* consumed */
    if (RINGBTL_OK != rc) {
        opal_output(0, "btl ringbtl: transport not created: %s (%s); declining",
                    ringbtl_strerror(rc), ringbtl_last_error());
        return NULL;
    }

    mca_btl_ringbtl_module.key_pending = key_pending;
    mca_btl_ringbtl_module.key_failed = false;
    if (OPAL_SUCCESS != mca_btl_ringbtl_module_init(&mca_btl_ringbtl_module, rt,
                                                    enable_mpi_threads)) {
        ringbtl_destroy(rt, 0);
        return NULL;
    }

    const char *uris = ringbtl_uris(rt);
    rc = ringbtl_compat_modex_send_uris(&c->super.btl_version, uris);
    if (OPAL_SUCCESS != rc) {
        opal_output(0, "btl ringbtl: publishing the address through the modex failed (%d)",
                    rc);
        mca_btl_ringbtl_module.super.btl_finalize(&mca_btl_ringbtl_module.super);
        return NULL;
    }
    if (c->verbose > 0) {
        opal_output(0, "btl ringbtl: rank %u backend %s uris %s max_frame %zu%s",
                    (unsigned) me.vpid, ringbtl_backend_name(rt), uris, ringbtl_max_frame(rt),
                    enable_mpi_threads ? " (MPI_THREAD_MULTIPLE: serialised)" : "");
    }

    mca_btl_base_module_t **modules = malloc(sizeof(*modules));
    if (NULL == modules) {
        mca_btl_ringbtl_module.super.btl_finalize(&mca_btl_ringbtl_module.super);
        return NULL;
    }
    modules[0] = &mca_btl_ringbtl_module.super;
    *num_btls = 1;
    return modules;

fail:
    ringbtl_config_free(cfg);
    return NULL;
}

int mca_btl_ringbtl_progress(void)
{
    mca_btl_ringbtl_module_t *m = &mca_btl_ringbtl_module;
    static bool reported = false;
    int n;

    if (NULL == m->rt || m->closing) {
        return 0;
    }
    if (m->threads) {
        /* Another thread progresses already: nothing to do here. */
        if (0 != pthread_mutex_trylock(&m->lock)) {
            return 0;
        }
    }
    m->sent_since_progress = 0;
    if (m->key_pending) {
        (void) mca_btl_ringbtl_ensure_key(m);
    }
    m->progressing = true;
    n = ringbtl_progress(m->rt);
    m->progressing = false;
    if (OPAL_UNLIKELY(m->nheld > 0)) {
        mca_btl_ringbtl_release_held(m);
    }
    if (OPAL_UNLIKELY(m->nreleased > 0)) {
        mca_btl_ringbtl_release_pending(m);
    }
    RINGBTL_UNLOCK(m);
    if (n < 0) {
        if (!reported) {
            reported = true;
            opal_output(0, "btl ringbtl: progress failed: %s (%s)", ringbtl_strerror(n),
                        ringbtl_last_error());
        }
        return 0;
    }
    return n;
}
