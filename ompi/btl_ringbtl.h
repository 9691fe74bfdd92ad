/*
 * mca_btl_ringbtl: an Open MPI BTL over ringbtl, the io_uring TCP transport of this
 * repository, through its C ABI (ffi/include/ringbtl.h). One source for Open MPI 4.1 (BTL
 * interface 3.1) and 5.0 (3.3, built with RINGBTL_OMPI5); what differs is confined to
 * btl_ringbtl_compat.[ch].
 *
 * One module per process (the default). The module owns one ringbtl transport whose process
 * id is this process's vpid; peers are the processes of the same job (same jobid),
 * addressed by vpid. With btl_ringbtl_if_modules 1 (a measurement switch: see
 * docs/design/links.md, "One module or one per interface") there is one module per
 * interface instead, as btl tcp does, each with a transport of its own bound to its
 * interface, and ob1 stripes large messages across them. Under MPI_THREAD_MULTIPLE the
 * peers are shared out among shards, one module (transport and lock) each, so that threads
 * sending to peers of different shards do not wait for each other. Send (in place), get
 * and put: ob1 sends eager and rendezvous headers as messages, and moves the body of a
 * large message with gets straight from the sender's buffer, which it registered with us
 * (ringbtl_register_region), or, with get not offered, with puts into the receiver's.
 */
#ifndef MCA_BTL_RINGBTL_H
#define MCA_BTL_RINGBTL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "btl_ringbtl_compat.h"

#include "ringbtl.h"

BEGIN_C_DECLS

/* One setting of the transport, exposed as MCA parameter btl_ringbtl_<mca> and passed to
 * ringbtl_config_set under <env> when the user set it. */
typedef struct {
    const char *mca;
    const char *env;
    const char *help;
    char *value; /* storage of the MCA variable; NULL = ringbtl's default */
} mca_btl_ringbtl_setting_t;

struct mca_btl_base_endpoint_t {
    opal_proc_t *proc;
    uint32_t peer;  /* ringbtl id: the vpid in this job; for another job's process, an id
                     * from the job size up (mca_btl_ringbtl_module_t.next_foreign) */
    bool failed;    /* ringbtl reported the peer failed */
};
typedef struct mca_btl_base_endpoint_t mca_btl_ringbtl_endpoint_t;

/* A registration: the ringbtl region key that peers name it by in their puts, or
 * RINGBTL_NO_REGION for memory registered for local use only (not writable by peers). */
struct mca_btl_base_registration_handle_t {
    uint64_t key;
};
#define RINGBTL_NO_REGION UINT64_MAX

/* A put in flight: what its completion callback needs. Its address (low bit set) is the
 * ringbtl cookie, which tells it from a send fragment's. */
typedef struct {
    opal_free_list_item_t super;
    struct mca_btl_base_endpoint_t *ep;
    void *local_address;
    struct mca_btl_base_registration_handle_t *local_handle;
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
} mca_btl_ringbtl_put_t;
OBJ_CLASS_DECLARATION(mca_btl_ringbtl_put_t);

/* A completion held back (mca_btl_ringbtl_module_t.held): its ringbtl cookie and status. */
typedef struct {
    uint64_t cookie;
    uint32_t peer;
    int status;
} mca_btl_ringbtl_held_t;

/* A subnet of a module's interface: a peer address on it is reached through that module. */
typedef struct {
    int family; /* AF_INET or AF_INET6 */
    uint8_t addr[16];
    unsigned prefix;
} mca_btl_ringbtl_net_t;
#define RINGBTL_MAX_NETS 8

typedef struct {
    mca_btl_base_module_t super;
    ringbtl_t *rt;
    /* Module per interface: this module's place among the component's modules, its
     * interface and that interface's subnets (nnets 0: every address). */
    unsigned index;
    /* Under MPI_THREAD_MULTIPLE the peers are shared out among `nshards` modules, each
     * with its transport and its lock, so that threads sending to peers of different
     * modules do not wait for each other: the pair (me, peer) belongs to module
     * (me + peer) % min(nshards, the peer's) on both sides (mca_btl_ringbtl_pair_shard).
     * One module: shard 0 of 1. */
    unsigned shard, nshards;
    char ifname[32];
    mca_btl_ringbtl_net_t nets[RINGBTL_MAX_NETS];
    unsigned nnets;
    mca_btl_base_module_error_cb_fn_t error_cb;
    /* Endpoints indexed by ringbtl id (NULL = not added): this job's processes by vpid,
     * other jobs' from `foreign_base` (the job size) on, in the order they were added. */
    mca_btl_ringbtl_endpoint_t **endpoints;
    uint32_t nendpoints;
    uint32_t foreign_base, next_foreign;
    /* The other jobs added to the transport (ringbtl_add_job). */
    opal_jobid_t *jobs;
    size_t njobs;
    ringbtl_pool_t eager_frags; /* capacity: btl_eager_limit */
    ringbtl_pool_t max_frags;   /* capacity: btl_max_send_size */
    ringbtl_pool_t puts;        /* mca_btl_ringbtl_put_t, for puts and gets */
    uint64_t puts_sent, gets_sent, regions_registered; /* btl_ringbtl_verbose */
    /* Regions ob1 released inside a progress callback while the reply to a peer's get still
     * held them (its send's completion not yet reaped): taken back after that progress. */
    uint64_t *released;
    size_t nreleased, released_cap;
    /* Sends, puts and gets that failed before their peer's failure was reported: ringbtl
     * completes a failed peer's pending operations first and reports the peer after them,
     * and ob1 aborts the job at the first failed completion with a message that does not
     * name the peer. They are held until on_error has reported the peer (which names it),
     * or until the progress that delivered them is over. */
    mca_btl_ringbtl_held_t *held;
    size_t nheld, held_cap;
    /* Aligned copy of a received frame whose bytes are not 8-byte aligned. */
    void *scratch;
    size_t scratch_len;
    /* Received frames and bytes, and those copied for alignment (btl_ringbtl_verbose). */
    uint64_t rx_frames, rx_bytes, rx_copied_frames, rx_copied_bytes;
    bool closing; /* finalize started: completions only recycle fragments */
    /* A send pushes its bytes out at once (the caller may next block outside MPI, e.g. in
     * a PMIx call, as MPI_Comm_accept does): ringbtl_flush, which runs no callback. */
    unsigned sent_since_progress; /* sends since the last component progress */
    bool progressing; /* inside ringbtl_progress: callbacks may run */
    /* The job key is rank 0's, from the modex: still to be read (before any connection),
     * or it could not be read (then no peer is reachable). */
    bool key_pending;
    bool key_failed;
    bool threads; /* MPI_THREAD_MULTIPLE: every entry point takes `lock` */
    pthread_mutex_t lock; /* recursive: ob1 sends from inside our callbacks */
} mca_btl_ringbtl_module_t;

typedef struct {
    mca_btl_base_component_3_0_0_t super;
    int verbose;
    int free_list_num;
    int free_list_max;
    int free_list_inc;
    unsigned int finalize_timeout_ms;
    unsigned int flush_batch;
    unsigned int block_flush_ms;
    mca_btl_ringbtl_setting_t *settings; /* terminated by mca == NULL */
    int if_modules; /* btl_ringbtl_if_modules: one module per interface */
    int shards;     /* btl_ringbtl_shards: 0 = decided from the CPUs the process may use */
    /* The modules created by btl_init (a finalized one is taken out: NULL). */
    mca_btl_ringbtl_module_t **modules;
    unsigned nmodules;
    /* btl_ringbtl_progress_thread: a thread progresses the modules while the program is
     * away from MPI (btl_ringbtl_progress_thread.c). */
    int progress_thread;
    unsigned int progress_thread_us;
} mca_btl_ringbtl_component_t;

OPAL_MODULE_DECLSPEC extern mca_btl_ringbtl_component_t mca_btl_ringbtl_component;
extern mca_btl_ringbtl_module_t mca_btl_ringbtl_module;

/* A send fragment: the descriptor, its segments and, behind it, `cap` bytes of buffer. */
typedef struct mca_btl_ringbtl_frag {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segs[2];
    mca_btl_ringbtl_endpoint_t *ep;
    ringbtl_pool_t *list;
    size_t cap;
    unsigned char *buf;
} mca_btl_ringbtl_frag_t;
OBJ_CLASS_DECLARATION(mca_btl_ringbtl_frag_t);


/* Most modules (interfaces) of btl_ringbtl_if_modules 1. */
#define RINGBTL_MAX_IF_MODULES 8

/* The modex key under which rank 0 publishes the job key (64 hex digits). */
#define RINGBTL_MODEX_JOB_KEY "btl.ringbtl.job_key"
/* The modex key under which rank 0 publishes the job's public key (ringbtl_job_public_key),
 * which another job reads once the two are connected (ringbtl_add_job). */
#define RINGBTL_MODEX_JOB_PUB "btl.ringbtl.job_pub"

/* The addresses a process publishes: its modules' URI lists ("tcp://ip:port;..."), one
 * after the other, separated by this character (one module: no separator). */
#define RINGBTL_MODULE_SEP '|'
/* Between the URI lists of shards (MPI_THREAD_MULTIPLE): a process with N shards publishes
 * N lists, each with every address, separated by this character. */
#define RINGBTL_SHARD_SEP '#'
/* At most this many shards (transports, rings, listening sockets) per process. */
#define RINGBTL_MAX_SHARDS 8

/* The shard of the pair (me, peer) for a process with `mine` shards and a peer that
 * published `theirs`: the same number on both sides. */
static inline unsigned mca_btl_ringbtl_pair_shard(uint32_t me, uint32_t peer, unsigned mine,
                                                  unsigned theirs)
{
    const unsigned n = mine < theirs ? mine : theirs;
    return n > 1 ? (unsigned) (((uint64_t) me + peer) % n) : 0;
}

/* The address of one URI ("tcp://1.2.3.4:5", "tcp://[::1]:5"; `len` bytes): true and its
 * family and bytes, or false when it is not one. */
bool mca_btl_ringbtl_uri_addr(const char *uri, size_t len, int *family, uint8_t addr[16]);
/* True when `addr` lies in `net`. */
bool mca_btl_ringbtl_net_contains(const mca_btl_ringbtl_net_t *net, int family,
                                  const uint8_t addr[16]);

int mca_btl_ringbtl_module_init(mca_btl_ringbtl_module_t *m, ringbtl_t *rt, bool threads);
void mca_btl_ringbtl_release_pending(mca_btl_ringbtl_module_t *m);
void mca_btl_ringbtl_release_held(mca_btl_ringbtl_module_t *m);
int mca_btl_ringbtl_progress(void);
/* One module's progress (under its lock when it has one; nothing when another thread
 * holds it). */
int mca_btl_ringbtl_progress_module(mca_btl_ringbtl_module_t *m);
/* The progress thread: started after the modules exist, stopped before the first is
 * finalized (btl_ringbtl_progress_thread.c). Start returns false, and says why, when no
 * thread could be started. */
bool mca_btl_ringbtl_progress_thread_start(void);
void mca_btl_ringbtl_progress_thread_stop(void);
/* While the progress thread runs: progress calls by Open MPI (the program's threads);
 * the thread stays out while the count moves. */
extern volatile unsigned long mca_btl_ringbtl_progress_calls;
int mca_btl_ringbtl_ensure_key(mca_btl_ringbtl_module_t *m);

#define RINGBTL_LOCK(m)                                                                  \
    do {                                                                                 \
        if ((m)->threads) {                                                              \
            pthread_mutex_lock(&(m)->lock);                                              \
        }                                                                                \
    } while (0)
#define RINGBTL_UNLOCK(m)                                                                \
    do {                                                                                 \
        if ((m)->threads) {                                                              \
            pthread_mutex_unlock(&(m)->lock);                                            \
        }                                                                                \
    } while (0)

END_C_DECLS

#endif
