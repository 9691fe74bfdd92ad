/*
 * mca_btl_ringbtl component: MCA parameters, version check, module creation (btl_init),
 * progress.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "btl_ringbtl.h"

#include <arpa/inet.h>
#include <sched.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>


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
     "Under MPI_THREAD_MULTIPLE or with the progress thread, the io_uring ring is built "
     "for any thread to drive",
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
    .if_modules = 0,
    .shards = 0,
    .progress_thread = 0,
    .progress_thread_us = 500,
    .modules = NULL,
    .nmodules = 0,
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
 * at most RINGBTL_DEFAULT_PUT_FRAG bytes straight into the receiver's buffer. Over links,
 * the library cuts a put into 1 MiB pieces that spread (ringbtl_put): tools/ompi-links.sh
 * --link-mbit 800, 4 MiB messages, one module over two links: 172 MB/s with 4 MiB puts
 * (113 before the library cut them), the same as with 2 MiB puts (171). */
#define RINGBTL_DEFAULT_PIPELINE_SEND (128 * 1024)
#define RINGBTL_DEFAULT_PUT_FRAG (4 * 1024 * 1024)
/* The transport's piece of a put spread over links (1 MiB, src/proto/endpoint.rs). */
#define RINGBTL_SPREAD_PIECE (1024 * 1024)
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

    (void) mca_base_component_var_register(
        c, "if_modules",
        "1: one module per interface, each with a ringbtl transport of its own limited to "
        "that interface, and ob1 stripes large messages across them, as btl tcp does "
        "(no failover between interfaces: a job loses a peer with an interface). 0 "
        "(default): one module, its links over every interface, a failed link's traffic "
        "moved to another. A switch to measure the two (docs/design/links.md, \"One "
        "module or one per interface\"), not a site setting",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_9, MCA_BASE_VAR_SCOPE_READONLY,
        &mca_btl_ringbtl_component.if_modules);

    (void) mca_base_component_var_register(
        c, "shards",
        "Under MPI_THREAD_MULTIPLE, the peers are shared out among this many modules, each "
        "with a transport (an io_uring ring or an epoll set, and a listening socket) and a "
        "lock of its own: threads that send to peers of different modules do not wait for "
        "each other. 0 (default): one per CPU the process may run on, at most 8 and at most "
        "one per other process of the job. 1: one module, every thread behind its lock. "
        "Without MPI_THREAD_MULTIPLE there is one module",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_READONLY,
        &mca_btl_ringbtl_component.shards);

    (void) mca_base_component_var_register(
        c, "progress_thread",
        "1: a thread progresses ringbtl, and through it ob1, while the program computes "
        "outside MPI, so that a rendezvous (a large message) moves meanwhile; it sleeps while "
        "the program is inside MPI. Open MPI is then entered from two threads "
        "(opal_using_threads, as with btl_tcp_progress_thread). 0: only the program's own "
        "MPI calls progress",
        MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_4, MCA_BASE_VAR_SCOPE_READONLY,
        &mca_btl_ringbtl_component.progress_thread);
    (void) mca_base_component_var_register(
        c, "progress_thread_us",
        "How often the progress thread looks whether the program is away from MPI (us)",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_9,
        MCA_BASE_VAR_SCOPE_READONLY, &mca_btl_ringbtl_component.progress_thread_us);

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
    /* Get offered: ob1 then reads a large message's body from the sender's buffer (RGET)
     * rather than have the sender write it (put, still taken where get cannot serve, and
     * alone with btl_ringbtl_flags send,put,inplace). On one node under cubic, 2-4 MiB
     * exchanges both ways at once ran up to 1.4 times as fast and a 1-4 MiB ping-pong took
     * 0.6 of the time; streams were unchanged, 1,000,000-byte exchanges 0.91 as fast
     * (docs/design/large-messages.md). */
    b->btl_flags = MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_SEND_INPLACE | MCA_BTL_FLAGS_PUT
                   | MCA_BTL_FLAGS_GET;
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
    free(mca_btl_ringbtl_component.modules);
    mca_btl_ringbtl_component.modules = NULL;
    mca_btl_ringbtl_component.nmodules = 0;
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

/* ---- addresses and interfaces --------------------------------------------------------- */

bool mca_btl_ringbtl_uri_addr(const char *uri, size_t len, int *family, uint8_t addr[16])
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *p = uri, *end = uri + len, *h, *he;

    if (len < 6 || 0 != strncmp(p, "tcp://", 6)) {
        return false;
    }
    p += 6;
    if (p < end && '[' == *p) {
        h = p + 1;
        he = memchr(h, ']', (size_t) (end - h));
        *family = AF_INET6;
    } else {
        h = p;
        he = NULL;
        for (const char *q = end; q > h; q--) {
            if (':' == q[-1]) {
                he = q - 1;
                break;
            }
        }
        *family = AF_INET;
    }
    if (NULL == he || he == h || (size_t) (he - h) >= sizeof(host)) {
        return false;
    }
    memcpy(host, h, (size_t) (he - h));
    host[he - h] = '\0';
    char *scope = strchr(host, '%');
    if (NULL != scope) {
        *scope = '\0';
    }
    memset(addr, 0, 16);
    return 1 == inet_pton(*family, host, addr);
}

bool mca_btl_ringbtl_net_contains(const mca_btl_ringbtl_net_t *net, int family,
                                  const uint8_t addr[16])
{
    if (net->family != family) {
        return false;
    }
    unsigned bits = net->prefix, i = 0;
    for (; bits >= 8; bits -= 8, i++) {
        if (net->addr[i] != addr[i]) {
            return false;
        }
    }
    if (bits > 0) {
        const uint8_t mask = (uint8_t) (0xff << (8 - bits));
        return (net->addr[i] & mask) == (addr[i] & mask);
    }
    return true;
}

static unsigned mask_bits(const struct sockaddr *sa)
{
    const uint8_t *b;
    size_t n;
    unsigned bits = 0;
    if (NULL == sa) {
        return 0;
    }
    if (AF_INET == sa->sa_family) {
        b = (const uint8_t *) &((const struct sockaddr_in *) sa)->sin_addr;
        n = 4;
    } else {
        b = (const uint8_t *) &((const struct sockaddr_in6 *) sa)->sin6_addr;
        n = 16;
    }
    for (size_t i = 0; i < n; i++) {
        for (int k = 7; k >= 0 && (b[i] >> k & 1); k--) {
            bits++;
        }
    }
    return bits;
}

/* One interface of the process's transport: its name, its addresses as an if_include
 * list (each as a /32 or /128), its subnets. */
typedef struct {
    char name[32];
    char include[512];
    mca_btl_ringbtl_net_t nets[RINGBTL_MAX_NETS];
    unsigned nnets;
} if_group_t;

/* The interfaces the addresses `uris` (a transport's) lie on, in their order: the number
 * of groups filled, 0 when an address is on no interface (then there is nothing to split),
 * said unless `quiet`. */
static unsigned if_groups(const char *uris, if_group_t *g, unsigned max, bool quiet)
{
    struct ifaddrs *all = NULL;
    unsigned n = 0;
    if (0 != getifaddrs(&all)) {
        if (!quiet) {
            opal_output(0, "btl ringbtl: getifaddrs: %s: one module", strerror(errno));
        }
        return 0;
    }
    for (const char *p = uris; '\0' != *p;) {
        const char *e = strchr(p, ';');
        const size_t len = NULL != e ? (size_t) (e - p) : strlen(p);
        int family;
        uint8_t addr[16];
        const struct ifaddrs *found = NULL;
        if (mca_btl_ringbtl_uri_addr(p, len, &family, addr)) {
            for (const struct ifaddrs *i = all; NULL != i && NULL == found; i = i->ifa_next) {
                if (NULL == i->ifa_addr || i->ifa_addr->sa_family != family) {
                    continue;
                }
                const struct sockaddr *sa = i->ifa_addr;
                const void *a = AF_INET == family
                                    ? (const void *) &((const struct sockaddr_in *) sa)->sin_addr
                                    : (const void *) &((const struct sockaddr_in6 *) sa)->sin6_addr;
                if (0 == memcmp(a, addr, AF_INET == family ? 4 : 16)) {
                    found = i;
                }
            }
        }
        if (NULL == found || strlen(found->ifa_name) >= sizeof(g->name)) {
            if (!quiet) {
                opal_output(0, "btl ringbtl: address %.*s on no interface found: one module",
                            (int) len, p);
            }
            freeifaddrs(all);
            return 0;
        }
        unsigned k = 0;
        while (k < n && 0 != strcmp(g[k].name, found->ifa_name)) {
            k++;
        }
        if (k == n) {
            if (n == max) {
                if (!quiet) {
                    opal_output(0, "btl ringbtl: more than %u interfaces: one module", max);
                }
                freeifaddrs(all);
                return 0;
            }
            memset(&g[k], 0, sizeof(g[k]));
            strcpy(g[k].name, found->ifa_name);
            n++;
        }
        char text[INET6_ADDRSTRLEN];
        inet_ntop(family, addr, text, sizeof(text));
        const size_t used = strlen(g[k].include);
        snprintf(g[k].include + used, sizeof(g[k].include) - used, "%s%s/%u",
                 0 == used ? "" : ",", text, AF_INET == family ? 32 : 128);
        if (g[k].nnets < RINGBTL_MAX_NETS) {
            mca_btl_ringbtl_net_t *net = &g[k].nets[g[k].nnets++];
            net->family = family;
            memcpy(net->addr, addr, sizeof(net->addr));
            net->prefix = mask_bits(found->ifa_netmask);
        }
        p += len;
        if ('\0' != *p) {
            p++;
        }
    }
    freeifaddrs(all);
    return n;
}

/* ---- btl_init ------------------------------------------------------------------------- */

/* The configuration of one transport: the environment, the job token, the job key (NULL:
 * read from the modex later), listen auto, the btl_ringbtl_* settings; `only` (module per
 * interface) replaces the interface selection. NULL when something was rejected (said). */
static ringbtl_config_t *make_config(opal_process_name_t me, const char *key, const char *only,
                                     bool threads)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    ringbtl_config_t *cfg = NULL;
    char token[32];

    if (RINGBTL_OK != ringbtl_config_new((uint32_t) me.vpid, &cfg)) {
        opal_output(0, "btl ringbtl: no configuration: %s", ringbtl_last_error());
        return NULL;
    }
    if (RINGBTL_OK != ringbtl_config_from_env(cfg)) {
        opal_output(0, "btl ringbtl: RINGBTL_* environment rejected: %s; declining",
                    ringbtl_last_error());
        goto fail;
    }
    /* A job is named by its jobid (the job token): the processes of another job that this
     * one spawned or connected to name it so (ensure_job in the module). */
    snprintf(token, sizeof(token), "%u", (unsigned) me.jobid);
    if (RINGBTL_OK != component_set(cfg, "job token", "RINGBTL_JOB_TOKEN", token)) {
        goto fail;
    }
    if (NULL != key && RINGBTL_OK != ringbtl_config_set(cfg, "RINGBTL_JOB_KEY", key)) {
        opal_output(0, "btl ringbtl: job key not set: %s; declining", ringbtl_last_error());
        goto fail;
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
        if (NULL != only
            && (0 == strcmp(s->mca, "if_include") || 0 == strcmp(s->mca, "if_exclude"))) {
            continue;
        }
        char what[64];
        snprintf(what, sizeof(what), "btl_ringbtl_%s", s->mca);
        if (RINGBTL_OK != component_set(cfg, what, s->env, s->value)) {
            goto fail;
        }
    }
    if (NULL != only && RINGBTL_OK != component_set(cfg, "module per interface",
                                                    "RINGBTL_IF_INCLUDE", only)) {
        goto fail;
    }
    /* MPI_THREAD_MULTIPLE or the progress thread: several threads may enter a module, one
     * at a time (it serialises them behind its lock); an io_uring ring is then built for
     * any thread to drive. */
    if (threads && RINGBTL_OK != ringbtl_config_threads(cfg, 1)) {
        opal_output(0, "btl ringbtl: %s; declining", ringbtl_last_error());
        goto fail;
    }
    return cfg;

fail:
    ringbtl_config_free(cfg);
    return NULL;
}

static ringbtl_t *make_transport(opal_process_name_t me, const char *key, const char *only,
                                 bool threads)
{
    ringbtl_t *rt = NULL;
    ringbtl_config_t *cfg = make_config(me, key, only, threads);
    if (NULL == cfg) {
        return NULL;
    }
    const int rc = ringbtl_create(cfg, &rt); /* consumes cfg */
    if (RINGBTL_OK != rc) {
        opal_output(0, "btl ringbtl: transport%s%s not created: %s (%s)%s",
                    NULL != only ? " on " : "", NULL != only ? only : "",
                    ringbtl_strerror(rc), ringbtl_last_error(),
                    NULL != only ? "" : "; declining");
        return NULL;
    }
    return rt;
}

/* Finalizes the modules created so far and forgets them (each finalize takes its module
 * out of the component's list). */
static void drop_modules(void)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    mca_btl_ringbtl_module_t **list = c->modules;
    const unsigned n = c->nmodules;
    for (unsigned i = 0; i < n; i++) {
        if (NULL != list[i]) {
            list[i]->super.btl_finalize(&list[i]->super);
        }
    }
    free(c->modules);
    c->modules = NULL;
    c->nmodules = 0;
}

/* How many shards a process under MPI_THREAD_MULTIPLE has: btl_ringbtl_shards when set,
 * else one per CPU it may run on (threads confined to fewer CPUs do not send at the same
 * time), at most RINGBTL_MAX_SHARDS and at most one per other process of its job (when the
 * launcher tells the job's size). */
static unsigned shard_count(void)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    unsigned n = 1;
    if (c->shards > 0) {
        n = (unsigned) c->shards;
    } else {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (0 == sched_getaffinity(0, sizeof(set), &set)) {
            n = (unsigned) CPU_COUNT(&set);
        }
    }
    const uint32_t size = ringbtl_compat_world_size();
    if (1 == size) {
        n = 1;
    } else if (size > 1 && n > size - 1) {
        n = size - 1;
    }
    if (n > RINGBTL_MAX_SHARDS) {
        n = RINGBTL_MAX_SHARDS;
    }
    return n > 0 ? n : 1;
}

static mca_btl_base_module_t **component_init(int *num_btls, bool enable_progress_threads,
                                            bool enable_mpi_threads)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    ringbtl_t *rt = NULL;
    ringbtl_t *per_if[RINGBTL_MAX_IF_MODULES] = {NULL};
    ringbtl_t *shard_rt[RINGBTL_MAX_SHARDS] = {NULL};
    unsigned nshards = 1;
    if_group_t groups[RINGBTL_MAX_IF_MODULES];
    unsigned ngroups = 0;
    char key[65];
    const char *keyp = NULL;
    int rc;

    (void) enable_progress_threads;
    *num_btls = 0;
    /* Entered from more than one thread: the program's (MPI_THREAD_MULTIPLE), or ours. */
    const bool threads = enable_mpi_threads || 0 != c->progress_thread;
    if (!ringbtl_compat_check()) {
        return NULL;
    }

    if (c->shards < 0) {
        opal_output(0, "btl ringbtl: btl_ringbtl_shards=%d rejected: 0 (decided from the "
                       "CPUs) or a count; the component declines",
                    c->shards);
        return NULL;
    }
    if (0 != c->if_modules && 1 != c->if_modules) {
        opal_output(0, "btl ringbtl: btl_ringbtl_if_modules=%d rejected: 0 (one module) or 1 "
                       "(one per interface); the component declines",
                    c->if_modules);
        return NULL;
    }
    const opal_process_name_t me = ringbtl_compat_my_name();
    /* The job key, with no user configuration: rank 0 draws one and publishes it through
     * the modex; the others read it before their first connection
     * (mca_btl_ringbtl_ensure_key). A key the user gave (RINGBTL_JOB_KEY or
     * RINGBTL_JOB_KEY_FILE, the same for every process) takes precedence. */
    bool key_pending = false;
    if (NULL == getenv("RINGBTL_JOB_KEY") && NULL == getenv("RINGBTL_JOB_KEY_FILE")) {
        if (0 == me.vpid) {
            rc = ringbtl_generate_job_key(key);
            if (RINGBTL_OK == rc) {
                rc = ringbtl_compat_modex_send_string(RINGBTL_MODEX_JOB_KEY, key);
            }
            if (OPAL_SUCCESS != rc) {
                memset(key, 0, sizeof(key));
                opal_output(0, "btl ringbtl: no job key published (%d: %s); declining", rc,
                            ringbtl_last_error());
                return NULL;
            }
            keyp = key;
        } else {
            key_pending = true;
        }
    }

    rt = make_transport(me, keyp, NULL, threads);
    if (NULL == rt) {
        memset(key, 0, sizeof(key));
        return NULL;
    }
    /* The job's public key, for the jobs this one will spawn or connect to (every process
     * of the job derives the same; rank 0's is read). */
    if (0 == me.vpid) {
        char pub[65];
        rc = ringbtl_job_public_key(rt, pub);
        if (RINGBTL_OK == rc) {
            rc = ringbtl_compat_modex_send_string(RINGBTL_MODEX_JOB_PUB, pub);
        }
        if (OPAL_SUCCESS != rc) {
            opal_output(0, "btl ringbtl: the job's public key was not published (%d): "
                           "processes of other jobs cannot reach this one",
                        rc);
        }
    }
    /* Module per interface: one transport per interface the first one listens on, each
     * limited to that interface's addresses; the first is closed once they all exist. Any
     * failure keeps the first as the one module. */
    if (c->if_modules) {
        ngroups = if_groups(ringbtl_uris(rt), groups, RINGBTL_MAX_IF_MODULES, false);
        for (unsigned i = 0; ngroups > 1 && i < ngroups; i++) {
            per_if[i] = make_transport(me, keyp, groups[i].include, threads);
            if (NULL == per_if[i]) {
                opal_output(0, "btl ringbtl: btl_ringbtl_if_modules: no transport on %s: "
                               "one module",
                            groups[i].name);
                while (i-- > 0) {
                    (void) ringbtl_destroy(per_if[i], 0);
                }
                ngroups = 0;
            }
        }
        if (ngroups > 1) {
            (void) ringbtl_destroy(rt, 0);
            rt = NULL;
        } else {
            if (1 == ngroups && c->verbose > 0) {
                opal_output(0, "btl ringbtl: btl_ringbtl_if_modules: one interface (%s): "
                               "one module",
                            groups[0].name);
            }
            ngroups = 0;
        }
    }
    /* Shards (MPI_THREAD_MULTIPLE, one module for every interface): one transport each,
     * the first the one made above. Any failure keeps the first as the one module. */
    if (enable_mpi_threads && ngroups <= 1) {
        nshards = shard_count();
        for (unsigned i = 1; i < nshards; i++) {
            shard_rt[i] = make_transport(me, keyp, NULL, threads);
            if (NULL == shard_rt[i]) {
                opal_output(0, "btl ringbtl: shard %u of %u not created: one module", i,
                            nshards);
                for (unsigned j = 1; j < i; j++) {
                    (void) ringbtl_destroy(shard_rt[j], 0);
                    shard_rt[j] = NULL;
                }
                nshards = 1;
            }
        }
    }
    memset(key, 0, sizeof(key));

    const unsigned n = ngroups > 1 ? ngroups : nshards;
    /* A get's reply is one frame, and a frame never spreads over links (puts are cut into
     * pieces that do): a module over several interfaces has ob1 read a large message in
     * gets of RINGBTL_SPREAD_PIECE, each free to take its own link. */
    const bool spreads = ngroups <= 1
                         && 1 != if_groups(ringbtl_uris(rt), groups, RINGBTL_MAX_IF_MODULES,
                                           true);
    c->modules = calloc(n, sizeof(*c->modules));
    mca_btl_base_module_t **modules = calloc(n, sizeof(*modules));
    if (NULL == c->modules || NULL == modules) {
        goto nomem;
    }
    for (unsigned i = 0; i < n; i++) {
        mca_btl_ringbtl_module_t *m = &mca_btl_ringbtl_module;
        if (n > 1) {
            /* Each a copy of the module the MCA parameters were registered into (as btl tcp
             * makes its modules). */
            m = malloc(sizeof(*m));
            if (NULL == m) {
                goto nomem;
            }
            memcpy(m, &mca_btl_ringbtl_module, sizeof(*m));
        }
        if (ngroups > 1) {
            m->nnets = groups[i].nnets;
            memcpy(m->nets, groups[i].nets, sizeof(m->nets));
            strcpy(m->ifname, groups[i].name);
            rt = per_if[i];
            per_if[i] = NULL;
        } else {
            /* The one module, or a shard: every address. */
            m->nnets = 0;
            m->ifname[0] = '\0';
            if (i > 0) {
                rt = shard_rt[i];
                shard_rt[i] = NULL;
            }
        }
        m->shard = nshards > 1 ? i : 0;
        m->nshards = nshards;
        m->index = i;
        m->key_pending = key_pending;
        m->key_failed = false;
        if (OPAL_SUCCESS != mca_btl_ringbtl_module_init(m, rt, threads)) {
            ringbtl_destroy(rt, 0);
            if (m != &mca_btl_ringbtl_module) {
                free(m);
            }
            rt = NULL;
            goto fail;
        }
        rt = NULL;
        if (spreads && m->super.btl_get_limit > RINGBTL_SPREAD_PIECE) {
            m->super.btl_get_limit = RINGBTL_SPREAD_PIECE;
        }
        c->modules[i] = m;
        c->nmodules = i + 1;
        modules[i] = &m->super;
    }

    /* The modules' addresses, one after the other (RINGBTL_MODULE_SEP between interfaces,
     * RINGBTL_SHARD_SEP between shards). */
    size_t len = 1;
    for (unsigned i = 0; i < n; i++) {
        len += strlen(ringbtl_uris(c->modules[i]->rt)) + 1;
    }
    char *uris = malloc(len);
    if (NULL == uris) {
        goto nomem;
    }
    uris[0] = '\0';
    for (unsigned i = 0; i < n; i++) {
        const size_t used = strlen(uris);
        const char sep[2] = {0 == i ? '\0'
                             : nshards > 1 ? RINGBTL_SHARD_SEP
                                           : RINGBTL_MODULE_SEP,
                             '\0'};
        snprintf(uris + used, len - used, "%s%s", sep, ringbtl_uris(c->modules[i]->rt));
    }
    rc = ringbtl_compat_modex_send_uris(&c->super.btl_version, uris);
    free(uris);
    if (OPAL_SUCCESS != rc) {
        opal_output(0, "btl ringbtl: publishing the address through the modex failed (%d)",
                    rc);
        goto fail;
    }
    for (unsigned i = 0; c->verbose > 0 && i < n; i++) {
        mca_btl_ringbtl_module_t *m = c->modules[i];
        char which[96] = "";
        if (n > 1 && nshards > 1) {
            snprintf(which, sizeof(which), " module %u of %u (shard)", i, n);
        } else if (n > 1) {
            snprintf(which, sizeof(which), " module %u of %u (%s)", i, n, m->ifname);
        }
        opal_output(0, "btl ringbtl: rank %u backend %s uris %s max_frame %zu get_limit %zu%s%s",
                    (unsigned) me.vpid, ringbtl_backend_name(m->rt), ringbtl_uris(m->rt),
                    ringbtl_max_frame(m->rt), m->super.btl_get_limit, which,
                    enable_mpi_threads ? " (MPI_THREAD_MULTIPLE)"
                    : 0 != c->progress_thread ? " (progress thread)" : "");
    }
    if (0 != c->progress_thread && !mca_btl_ringbtl_progress_thread_start()) {
        goto fail;
    }
    *num_btls = (int) n;
    return modules;

nomem:
    opal_output(0, "btl ringbtl: out of memory creating the modules; declining");
fail:
    if (NULL != rt) {
        ringbtl_destroy(rt, 0);
    }
    for (unsigned i = 0; ngroups > 1 && i < ngroups; i++) {
        if (NULL != per_if[i]) {
            ringbtl_destroy(per_if[i], 0);
        }
    }
    for (unsigned i = 1; i < nshards; i++) {
        if (NULL != shard_rt[i]) {
            ringbtl_destroy(shard_rt[i], 0);
        }
    }
    free(modules);
    drop_modules();
    return NULL;
}

int mca_btl_ringbtl_progress_module(mca_btl_ringbtl_module_t *m)
{
    static bool reported = false;
    int n;

    if (NULL == m || NULL == m->rt || m->closing) {
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

int mca_btl_ringbtl_progress(void)
{
    mca_btl_ringbtl_component_t *c = &mca_btl_ringbtl_component;
    int n = 0;
    if (0 != c->progress_thread) {
        /* Signs of life for the progress thread (a lost increment between two program
         * threads still changes the count). */
        __atomic_store_n(&mca_btl_ringbtl_progress_calls,
                         __atomic_load_n(&mca_btl_ringbtl_progress_calls, __ATOMIC_RELAXED) + 1,
                         __ATOMIC_RELAXED);
    }
    for (unsigned i = 0; i < c->nmodules; i++) {
        n += mca_btl_ringbtl_progress_module(c->modules[i]);
    }
    return n;
}
