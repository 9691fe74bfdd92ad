/*
 * ringbtl.h - C ABI of ringbtl, a TCP byte-transfer layer for HPC message passing on
 * Linux (io_uring, with an epoll fallback).
 *
 * Library: libringbtl_ffi.a (static) or libringbtl_ffi.so (shared), built by
 *     cargo build --release -p ringbtl-ffi
 * into target/release/. Linking the static library also needs the C libraries the Rust
 * standard library uses:
 *     cc prog.c -Iffi/include target/release/libringbtl_ffi.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
 *
 * ABI version 2: ringbtl_register_region takes a flags argument (RINGBTL_REGION_PEER_WRITE
 * for puts, what version 1 registered; RINGBTL_REGION_PEER_READ for ringbtl_get, which
 * version 2 adds). Changes to the
 * contract below are announced here, with the version bump they need. Beyond the first
 * agreed text, version 1 also says:
 * - ringbtl_add_peer: RINGBTL_ERR_INVALID for a URI list that does not parse,
 *   RINGBTL_ERR_UNREACHABLE when none of its addresses is reachable from the selected
 *   interfaces (RINGBTL_LISTEN=auto with RINGBTL_IF_INCLUDE / RINGBTL_IF_EXCLUDE),
 *   RINGBTL_ERR_UNKNOWN_PEER for the local id itself;
 * - ringbtl_unregister of a tag without a callback: RINGBTL_ERR_INVALID;
 * - ringbtl_destroy runs the completions still owed before it returns, and is refused
 *   (RINGBTL_ERR_INVALID, nothing done) inside a callback;
 * - completions that arrive while no completion callback is set are dropped: set it
 *   before the first send;
 * - ringbtl_progress / ringbtl_wait count the callbacks they ran among the events;
 * - ringbtl_last_error's text lives in one buffer per thread (up to 2047 bytes), so a
 *   pointer kept past the next failing call shows the newer message;
 * - after RINGBTL_ERR_INTERNAL the transport's state is unknown: destroy it;
 * - ringbtl_flush (added without a version bump: it only adds a symbol);
 * - ringbtl_on_unknown_peer, ringbtl_generate_job_key, ringbtl_set_job_key (likewise);
 * - ringbtl_put, ringbtl_register_region, ringbtl_deregister_region and the status
 *   RINGBTL_ERR_BUSY (likewise: added symbols and a new code);
 * - ringbtl_wait_fd (likewise);
 * - ringbtl_config_threads (likewise);
 * - ringbtl_job_public_key, ringbtl_add_job, ringbtl_add_peer_of_job (likewise; the
 *   handshake of protocol version 12 names both ends' jobs).
 *
 * Threads: one thread drives a transport. Every function taking a ringbtl_t must be
 * called on the thread that drives it, and every callback runs on that thread, from
 * inside ringbtl_progress / ringbtl_wait / ringbtl_destroy. There are no locks inside;
 * a program with several threads serializes the calls itself. A transport whose
 * configuration said ringbtl_config_threads(cfg, 1) may be driven by any thread, one
 * call at a time (callbacks run on the thread whose call runs them).
 *
 * Callbacks may call ringbtl_send, ringbtl_put, ringbtl_register_region,
 * ringbtl_deregister_region, ringbtl_progress (which then returns 0 and does
 * nothing), ringbtl_wait (likewise), ringbtl_register, ringbtl_unregister, ringbtl_add_peer,
 * ringbtl_on_complete, ringbtl_on_error, ringbtl_on_unknown_peer, ringbtl_pending and the
 * accessors. ringbtl_destroy
 * inside a callback is refused (RINGBTL_ERR_INVALID).
 *
 * Errors: functions return RINGBTL_OK (0) or a negative RINGBTL_ERR_* code, and leave a
 * message for ringbtl_last_error(). No Rust panic crosses this boundary: one is caught
 * and reported as RINGBTL_ERR_INTERNAL.
 *
 * Memory of a send: ringbtl_send does not copy large segments. Their bytes must stay
 * valid and unchanged until the completion callback for the send's cookie has run; the
 * library reports a send complete (with any status) only once the kernel has handed the
 * batch that carries it back, so after the completion the caller may free or reuse the
 * memory. A large payload may lend its pages to the kernel instead of being copied
 * (docs/design/large-messages.md says which): its completion comes once the peer has
 * acknowledged reading it, or, on a failure, as the connection is reset, which discards
 * what the kernel still held of it.
 * One exception: if ringbtl_destroy's drain runs out of time while a send is
 * still inside the kernel, its completion runs with RINGBTL_ERR_SHUTDOWN while the
 * kernel may still read the bytes; such memory must stay valid until the process exits
 * (the library leaks its own buffers in that case for the same reason).
 *
 * Hot path: ringbtl_send, ringbtl_progress and the receive and completion callbacks
 * allocate nothing once the connections are warm.
 */
#ifndef RINGBTL_H
#define RINGBTL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RINGBTL_ABI_VERSION 2u          /* bumped on any incompatible change */
uint32_t ringbtl_abi_version(void);     /* the library's RINGBTL_ABI_VERSION */

typedef struct ringbtl ringbtl_t;               /* one transport; one thread drives it */
typedef struct ringbtl_config ringbtl_config_t; /* settings before creation */

/* Status codes: 0 ok, negative errors. */
enum {
    RINGBTL_OK = 0,
    RINGBTL_ERR_INVALID = -1,          /* bad argument (null pointer, bad tag, ...) */
    RINGBTL_ERR_CONFIG = -2,           /* bad setting: ringbtl_last_error() names it */
    RINGBTL_ERR_IO = -3,               /* a system call failed (errno in the message) */
    RINGBTL_ERR_UNREACHABLE = -4,      /* the peer failed earlier / connection lost */
    RINGBTL_ERR_UNKNOWN_PEER = -5,
    RINGBTL_ERR_TOO_LARGE = -6,        /* above the maximum frame size */
    RINGBTL_ERR_TOO_MANY_SEGMENTS = -7,
    RINGBTL_ERR_SHUTDOWN = -8,         /* shutting down / shut down */
    RINGBTL_ERR_TAG_IN_USE = -9,
    RINGBTL_ERR_WOULD_BLOCK = -10,     /* ringbtl_send: peer's queue full, not accepted:
                                        * progress, then send again */
    RINGBTL_ERR_TIMEOUT = -11,
    RINGBTL_ERR_NO_BACKEND = -12,
    RINGBTL_ERR_PEER_CLOSED = -13,     /* completion status: peer closed cleanly (FIN) first */
    RINGBTL_ERR_PROTOCOL = -14,        /* completion status: the peer broke the protocol */
    RINGBTL_ERR_BUSY = -15,            /* ringbtl_deregister_region: a put is being received
                                        * into the region: progress, then try again */
    RINGBTL_ERR_INTERNAL = -99         /* a Rust panic was caught at the boundary */
};
const char *ringbtl_strerror(int status);   /* static string, never NULL */
/* Message of the last failed call on this thread (names the setting, errno text, ...);
 * valid until the next ringbtl call on this thread; "" when none. */
const char *ringbtl_last_error(void);

typedef struct { const void *base; size_t len; } ringbtl_iov_t;

/* A received active message: `data`/`len` are valid only during the call. */
typedef void (*ringbtl_recv_fn)(void *ctx, uint32_t src, uint8_t tag,
                                const void *data, size_t len);
/* Exactly once per accepted ringbtl_send: status RINGBTL_OK or a negative code. */
typedef void (*ringbtl_complete_fn)(void *ctx, uint32_t peer, uint64_t cookie, int status);
/* Once per failed peer; `msg` valid during the call. */
typedef void (*ringbtl_error_fn)(void *ctx, uint32_t peer, int status, const char *msg);

/* A process that was never added with ringbtl_add_peer connected and claims id `peer`;
 * its handshake passed every other check (protocol version, job token, and its
 * authentication when the transport authenticates). Return nonzero to accept it, after
 * adding it with ringbtl_add_peer(t, peer, ...) from inside the call; zero refuses it (the
 * dialer's peer fails with RINGBTL_ERR_PROTOCOL), as does accepting a peer not added. */
typedef int (*ringbtl_resolve_fn)(void *ctx, uint32_t peer);

/* Configuration: defaults for process id `local_id` (its rank in the job). */
int  ringbtl_config_new(uint32_t local_id, ringbtl_config_t **out);
/* Sets one parameter by its environment-variable name ("RINGBTL_MAX_FRAME", ...), with the
 * same parsing and range checks as the environment. RINGBTL_ERR_CONFIG on a bad name/value
 * (the setting is then unchanged). An empty value leaves the setting unchanged, as an
 * empty environment variable does. */
int  ringbtl_config_set(ringbtl_config_t *cfg, const char *name, const char *value);
/* Applies the RINGBTL_* variables of the process environment. */
int  ringbtl_config_from_env(ringbtl_config_t *cfg);
/* Nonzero: the transport will be entered from more than one thread, one call at a time
 * (the caller holds a lock around every call, as under MPI_THREAD_MULTIPLE or with a
 * progress thread). The io_uring backend then builds a ring any thread may drive (no
 * SINGLE_ISSUER, DEFER_TASKRUN or COOP_TASKRUN). Off by default. */
int  ringbtl_config_threads(ringbtl_config_t *cfg, int on);
void ringbtl_config_free(ringbtl_config_t *cfg);   /* NULL is fine */

/* Creates the transport (listens, selects the backend). `cfg` is consumed in every case. */
int  ringbtl_create(ringbtl_config_t *cfg, ringbtl_t **out);
/* FIN to every peer, drain up to timeout_ms, close, free. NULL is fine. The completion
 * callback runs (RINGBTL_ERR_SHUTDOWN) for sends still pending before it returns. */
int  ringbtl_destroy(ringbtl_t *t, uint32_t timeout_ms);

/* The local URI list ("tcp://ip:port;..."), NUL-terminated, owned by `t`. */
const char *ringbtl_uris(const ringbtl_t *t);
uint32_t ringbtl_local_id(const ringbtl_t *t);
const char *ringbtl_backend_name(const ringbtl_t *t);   /* "uring" or "epoll" */
size_t   ringbtl_max_frame(const ringbtl_t *t);         /* largest message, bytes */
size_t   ringbtl_max_segments(void);                    /* most iovecs per send (8) */

/* Adds peer `peer` with its URI list (as returned by its ringbtl_uris). Connections are
 * made lazily on first send. */
int  ringbtl_add_peer(ringbtl_t *t, uint32_t peer, const char *uris);

/* Job key (authenticated connections): a fresh one from the operating system's random
 * source, as 64 hexadecimal digits and a NUL into out[65]; and the key of a live
 * transport, for a key that arrives after creation (from the launcher's key-value store),
 * before the first connection. RINGBTL_ERR_INVALID for a key that is not 64 hex digits.
 * At creation the key is the setting RINGBTL_JOB_KEY (ringbtl_config_set). */
int  ringbtl_generate_job_key(char out[65]);
int  ringbtl_set_job_key(ringbtl_t *t, const char *hex);

/* Processes of other jobs (a job this one spawned, or connected to). A job is named by
 * its token (RINGBTL_JOB_TOKEN). ringbtl_job_public_key writes the public key of the
 * transport's job (derived from its job key; the same in every process of the job) as 64
 * hex digits and a NUL into out[65]: publish it where the other job can read it (the
 * launcher's key-value store). ringbtl_add_job takes the other job's: both jobs derive the
 * same key for their connections, and neither learns the other's job key; set the job key
 * first. RINGBTL_ERR_INVALID for a key that is not 64 hex digits, not a usable public key,
 * or the transport's own job. ringbtl_add_peer_of_job adds process `rank` of job `job`
 * under `peer`, an id of this transport's choosing that no process of its job and no
 * other process of another job goes by: messages from it arrive from `peer`, sends to
 * `peer` reach it; errors as ringbtl_add_peer (RINGBTL_ERR_UNKNOWN_PEER for an id taken,
 * or a job not added). A process of a job not added that dials is refused, and retries
 * until its connect timeout (RINGBTL_CONNECT_TIMEOUT_MS): add the other job as soon as it
 * is known. */
int  ringbtl_job_public_key(ringbtl_t *t, char out[65]);
int  ringbtl_add_job(ringbtl_t *t, uint64_t job, const char *public_hex);
int  ringbtl_add_peer_of_job(ringbtl_t *t, uint32_t peer, uint64_t job, uint32_t rank,
                             const char *uris);

int  ringbtl_register(ringbtl_t *t, uint8_t tag, ringbtl_recv_fn fn, void *ctx);
int  ringbtl_unregister(ringbtl_t *t, uint8_t tag);     /* allowed inside its own callback */
void ringbtl_on_complete(ringbtl_t *t, ringbtl_complete_fn fn, void *ctx);
void ringbtl_on_error(ringbtl_t *t, ringbtl_error_fn fn, void *ctx);
/* Sets (or with NULL clears) the resolver of unknown peers (lazy add). It runs inside
 * ringbtl_progress / ringbtl_wait; the connection waits for its answer within the handshake
 * deadline. Without one, a process that was never added is refused at once. */
void ringbtl_on_unknown_peer(ringbtl_t *t, ringbtl_resolve_fn fn, void *ctx);

/* Queues one message: the concatenation of iov[0..iovcnt] (iovcnt <= ringbtl_max_segments()).
 * The bytes are NOT copied: they must stay valid and unchanged until the completion
 * callback for `cookie` has run (small segments may be copied, which changes nothing for
 * the caller). Returns RINGBTL_OK (then exactly one completion follows) or a negative
 * code (then none follows). RINGBTL_ERR_WOULD_BLOCK: more than RINGBTL_MAX_QUEUED_BYTES
 * would wait for that peer (it reads slower than we send); the message was not accepted:
 * progress (outside callbacks), then send it again. Allowed inside any callback. */
int  ringbtl_send(ringbtl_t *t, uint32_t peer, uint8_t tag,
                  const ringbtl_iov_t *iov, size_t iovcnt, uint64_t cookie);

/* One-sided put: queues the concatenation of iov[0..iovcnt] to be written at `addr` in the
 * region `key` that `peer` registered with ringbtl_register_region (the peer told us both,
 * in its own messages). The peer's kernel writes the bytes straight into that memory; no
 * callback runs there. The peer checks the whole write against its regions: one outside
 * them is a protocol error that fails the connection (RINGBTL_ERR_PROTOCOL on both sides).
 * Memory, completion, RINGBTL_ERR_WOULD_BLOCK and order are those of ringbtl_send: a message
 * sent after the put arrives after its data is in place, which is how the peer learns it.
 * While a second link to `peer` is open, a put of more than 1 MiB goes as pieces of 1 MiB
 * that spread over the links (one completion still, with the last); the peer checks each
 * piece, so pieces inside a region may be in place before one outside it fails the link. */
int  ringbtl_put(ringbtl_t *t, uint32_t peer, uint64_t key, uint64_t addr,
                 const ringbtl_iov_t *iov, size_t iovcnt, uint64_t cookie);
/* One-sided get: queues a read of `len` bytes at `addr` in the region `key` that `peer`
 * registered with RINGBTL_REGION_PEER_READ, written at `local_addr` in our region
 * `local_key` straight from the socket. Exactly one completion with `cookie` follows a
 * RINGBTL_OK, once the bytes are in place (or with the peer's failure). RINGBTL_ERR_INVALID
 * (nothing sent) when the destination does not lie inside one of our regions;
 * RINGBTL_ERR_WOULD_BLOCK while the gets in progress to `peer` ask for
 * RINGBTL_MAX_QUEUED_BYTES already. The peer checks the source against its readable
 * regions: one outside them is a protocol error that fails the connection. No callback
 * runs on the peer. Allowed inside any callback. */
int  ringbtl_get(ringbtl_t *t, uint32_t peer, uint64_t key, uint64_t addr, uint32_t len,
                 uint64_t local_key, uint64_t local_addr, uint64_t cookie);
/* ringbtl_register_region flags: peers may write into the region (ringbtl_put), read it
 * (ringbtl_get); with neither (0), only the replies of our own gets land there. */
#define RINGBTL_REGION_PEER_WRITE 1u
#define RINGBTL_REGION_PEER_READ 2u
/* Registers `len` bytes at `base` as memory that peers may do with what `flags` says
 * (RINGBTL_REGION_PEER_WRITE | RINGBTL_REGION_PEER_READ, or 0); the key for them goes to
 * *key. Replies to our own gets land in regions of any flags. The memory must stay valid, nothing else may read or write
 * it while a put may land there, nor write it while a get may read it, until
 * ringbtl_deregister_region returns RINGBTL_OK for the key (or the transport is
 * destroyed). RINGBTL_ERR_INVALID for unknown flags. */
int  ringbtl_register_region(ringbtl_t *t, void *base, size_t len, uint32_t flags,
                             uint64_t *key);
/* Takes a region back: RINGBTL_ERR_INVALID for a key that names none, RINGBTL_ERR_BUSY while
 * a put (or our get's reply) is being received into it or a get's reply read from it is
 * being sent (it stays registered: progress, then try again). */
int  ringbtl_deregister_region(ringbtl_t *t, uint64_t key);

/* Hands every message queued so far to the kernel now, without reaping completions or
 * running any callback (they wait for the next ringbtl_progress / ringbtl_wait). Sends are
 * queued and leave together, one gathered write per peer, at the end of each pass; call
 * this after sending when the caller may next block outside ringbtl (a launcher's barrier,
 * a blocking PMIx call) so that the messages travel meanwhile. One system call on
 * io_uring when something is queued, none otherwise. Allowed inside any callback.
 * Returns RINGBTL_OK or a negative code. */
int  ringbtl_flush(ringbtl_t *t);
/* One non-blocking pass: submit, reap, run callbacks. Returns the number of events handled
 * (>= 0) or a negative code. Re-entrant: called from inside a callback it returns 0 and
 * does nothing (the outer pass continues). */
int  ringbtl_progress(ringbtl_t *t);
/* Like progress but may sleep in the kernel up to timeout_us when nothing is ready. */
int  ringbtl_wait(ringbtl_t *t, uint32_t timeout_us);
/* Sends accepted for `peer` whose completion has not run yet. */
size_t ringbtl_pending(const ringbtl_t *t, uint32_t peer);
/* Readies t to be waited for outside it, by a thread that then calls ringbtl_progress
 * (the calls serialized): RINGBTL_OK with *fd a descriptor that polls readable (POLLIN)
 * once the transport has something to collect (its epoll instance, or an eventfd its
 * io_uring ring signals), or
 * -1 when it has something already (progress now); RINGBTL_ERR_INVALID for NULL or
 * inside a callback. Call it right after a progress, before each wait. The transport's
 * own timers are not on the descriptor: wait with a timeout. Never close it. */
int  ringbtl_wait_fd(ringbtl_t *t, int *fd);

/* Links (RINGBTL_LINKS, one set per pair of interfaces on a shared subnet): connections
 * open to `peer`, its first and its links (0 when not connected, unknown, or t NULL). With
 * a standby link open, a send completes once the peer confirmed it, and a failed
 * connection moves the peer's traffic to a standby link without losing a message. */
size_t ringbtl_links_open(const ringbtl_t *t, uint32_t peer);
typedef struct {
    uint64_t joined;     /* links beyond a peer's first connection that joined */
    uint64_t lost;       /* open links lost while their peer stayed connected */
    uint64_t failovers;  /* times a peer's traffic moved to a standby link */
    uint64_t stalls;     /* of those, started because the primary stopped acknowledging */
} ringbtl_link_stats_t;
/* Counters over every peer since creation: RINGBTL_OK, or RINGBTL_ERR_INVALID for NULL. */
int  ringbtl_link_stats(const ringbtl_t *t, ringbtl_link_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif /* RINGBTL_H */
