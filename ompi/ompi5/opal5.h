/*
 * The part of Open MPI 5.0's internal interface (libopen-pal.so.80, BTL interface 3.3)
 * that the ringbtl component uses, declared for a build without Open MPI 5's internal
 * headers: no distribution installs them, and the PyPI build ships only mpi.h.
 *
 * Written from the published v5.0.x sources (opal/mca/btl/btl.h, opal/mca/mca.h,
 * opal/class/opal_object.h, opal_list.h, opal_free_list.h, opal/util/proc.h,
 * opal/mca/base/mca_base_var.h, opal/include/opal/constants.h) for a build configured
 * without debugging (OPAL_ENABLE_DEBUG 0), without CUDA GDR and without heterogeneous
 * support, which is how distributions and PyPI build it. What a mismatch would break is
 * checked when the component loads (btl_ringbtl_compat.c: ringbtl_compat_check): sizes of
 * the structures read from the library's own class objects and symbols.
 */
#ifndef RINGBTL_OPAL5_H
#define RINGBTL_OPAL5_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
#    define BEGIN_C_DECLS extern "C" {
#    define END_C_DECLS }
#else
#    define BEGIN_C_DECLS
#    define END_C_DECLS
#endif

BEGIN_C_DECLS

/* The series these declarations describe; the component declines under any other. */
#define OPAL_MAJOR_VERSION 5
#define OPAL_MINOR_VERSION 0
#define OPAL_RELEASE_VERSION 0
#define OPAL_IDENT_STRING "5.0.x (BTL interface 3.3)"

#define OPAL_DECLSPEC __attribute__((visibility("default")))
#define OPAL_MODULE_DECLSPEC __attribute__((visibility("default")))
#define OPAL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define OPAL_LIKELY(x) __builtin_expect(!!(x), 1)

/* ---- opal/include/opal/constants.h ---------------------------------------------------- */
enum {
    OPAL_SUCCESS = 0,
    OPAL_ERROR = -1,
    OPAL_ERR_OUT_OF_RESOURCE = -2,
    OPAL_ERR_RESOURCE_BUSY = -4,
    OPAL_ERR_BAD_PARAM = -5,
    OPAL_ERR_NOT_SUPPORTED = -8,
    OPAL_ERR_UNREACH = -12,
    OPAL_ERR_NOT_FOUND = -13,
    OPAL_ERR_NOT_AVAILABLE = -16,
};

/* ---- opal/include/opal/types.h, opal/util/proc.h -------------------------------------- */
typedef uint32_t opal_jobid_t;
typedef uint32_t opal_vpid_t;
typedef struct {
    opal_jobid_t jobid;
    opal_vpid_t vpid;
} opal_process_name_t;

typedef union {
    uint64_t lval;
    uint32_t ival;
    void *pval;
    struct {
        uint32_t uval;
        uint32_t lval;
    } sval;
} opal_ptr_t;

/* ---- opal/class/opal_object.h --------------------------------------------------------- */
typedef struct opal_object_t opal_object_t;
typedef struct opal_class_t opal_class_t;
typedef void (*opal_construct_t)(opal_object_t *);
typedef void (*opal_destruct_t)(opal_object_t *);

struct opal_class_t {
    const char *cls_name;
    opal_class_t *cls_parent;
    opal_construct_t cls_construct;
    opal_destruct_t cls_destruct;
    int cls_initialized;
    int cls_depth;
    opal_construct_t *cls_construct_array;
    opal_destruct_t *cls_destruct_array;
    size_t cls_sizeof;
};

struct opal_object_t {
    opal_class_t *obj_class;
    volatile int32_t obj_reference_count;
};

OPAL_DECLSPEC extern int opal_class_init_epoch;
OPAL_DECLSPEC void opal_class_initialize(opal_class_t *);
OPAL_DECLSPEC extern opal_class_t opal_object_t_class;

#define OBJ_CLASS(type) (&(type##_class))
#define OBJ_CLASS_DECLARATION(type) extern opal_class_t type##_class
#define OBJ_CLASS_INSTANCE(type, parent, ctor, dtor)                                       \
    opal_class_t type##_class = {#type,                                                    \
                                 OBJ_CLASS(parent),                                        \
                                 (opal_construct_t) (ctor),                                \
                                 (opal_destruct_t) (dtor),                                 \
                                 0,                                                        \
                                 0,                                                        \
                                 NULL,                                                     \
                                 NULL,                                                     \
                                 sizeof(type)}

/* What OBJ_CONSTRUCT does: the class set up once, then its constructors, base first. */
static inline void ringbtl_obj_construct(opal_object_t *obj, opal_class_t *cls)
{
    if (opal_class_init_epoch != cls->cls_initialized) {
        opal_class_initialize(cls);
    }
    obj->obj_class = cls;
    obj->obj_reference_count = 1;
    for (opal_construct_t *c = cls->cls_construct_array; NULL != *c; c++) {
        (*c)(obj);
    }
}

/* ---- opal/class/opal_list.h, opal_free_list.h ----------------------------------------- */
typedef struct opal_list_item_t {
    opal_object_t super;
    volatile struct opal_list_item_t *volatile opal_list_next;
    volatile struct opal_list_item_t *volatile opal_list_prev;
    int32_t item_free;
} opal_list_item_t;
OPAL_DECLSPEC extern opal_class_t opal_list_item_t_class;

typedef struct opal_free_list_item_t {
    opal_list_item_t super;
    struct mca_rcache_base_registration_t *registration;
    void *ptr;
} opal_free_list_item_t;
OPAL_DECLSPEC extern opal_class_t opal_free_list_item_t_class;

typedef int (*opal_free_list_item_init_fn_t)(opal_free_list_item_t *item, void *ctx);

/* ---- opal/util/proc.h ----------------------------------------------------------------- */
typedef uint16_t opal_hwloc_locality_t;
typedef struct opal_proc_t {
    opal_list_item_t super;
    opal_process_name_t proc_name;
    uint32_t proc_arch;
    opal_hwloc_locality_t proc_flags;
    struct opal_convertor_t *proc_convertor;
} opal_proc_t;
OPAL_DECLSPEC extern opal_class_t opal_proc_t_class;
OPAL_DECLSPEC opal_proc_t *opal_proc_local_get(void);
OPAL_DECLSPEC extern char *(*opal_process_name_print)(const opal_process_name_t);
OPAL_DECLSPEC extern struct opal_proc_t *(*opal_proc_for_name)(const opal_process_name_t name);
#define OPAL_NAME_PRINT(n) opal_process_name_print(n)

/* ---- utilities ------------------------------------------------------------------------ */
struct opal_bitmap_t;
typedef struct opal_bitmap_t opal_bitmap_t;
OPAL_DECLSPEC int opal_bitmap_set_bit(opal_bitmap_t *bm, int bit);
OPAL_DECLSPEC void opal_output(int output_id, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
OPAL_DECLSPEC const char *opal_strerror(int errnum);
OPAL_DECLSPEC extern const char opal_version_string[];
OPAL_DECLSPEC extern int opal_cache_line_size;
/* opal/mca/threads/thread_usage.h: Open MPI is entered from more than one thread. */
OPAL_DECLSPEC extern bool opal_uses_threads;

struct opal_convertor_t;
OPAL_DECLSPEC int32_t opal_convertor_pack(struct opal_convertor_t *pConv, struct iovec *iov,
                                          uint32_t *out_size, size_t *max_data);

/* ---- opal/mca/mca.h, opal/mca/base/mca_base_var.h ------------------------------------- */
typedef int (*mca_base_open_component_1_0_0_fn_t)(void);
typedef int (*mca_base_close_component_1_0_0_fn_t)(void);
typedef int (*mca_base_query_component_2_0_0_fn_t)(void **module, int *priority);
typedef int (*mca_base_register_component_params_2_0_0_fn_t)(void);

typedef struct mca_base_component_2_1_0_t {
    int mca_major_version;
    int mca_minor_version;
    int mca_release_version;
    char mca_project_name[16];
    int mca_project_major_version;
    int mca_project_minor_version;
    int mca_project_release_version;
    char mca_type_name[32];
    int mca_type_major_version;
    int mca_type_minor_version;
    int mca_type_release_version;
    char mca_component_name[64];
    int mca_component_major_version;
    int mca_component_minor_version;
    int mca_component_release_version;
    mca_base_open_component_1_0_0_fn_t mca_open_component;
    mca_base_close_component_1_0_0_fn_t mca_close_component;
    mca_base_query_component_2_0_0_fn_t mca_query_component;
    mca_base_register_component_params_2_0_0_fn_t mca_register_component_params;
    int32_t mca_component_flags;
    char reserved[28];
} mca_base_component_t;

#define MCA_BASE_METADATA_PARAM_NONE (uint32_t) 0x00
typedef struct mca_base_component_data_2_0_0_t {
    uint32_t param_field;
    char reserved[32];
} mca_base_component_data_t;

typedef enum {
    MCA_BASE_VAR_TYPE_INT,
    MCA_BASE_VAR_TYPE_UNSIGNED_INT,
    MCA_BASE_VAR_TYPE_UNSIGNED_LONG,
    MCA_BASE_VAR_TYPE_UNSIGNED_LONG_LONG,
    MCA_BASE_VAR_TYPE_SIZE_T,
    MCA_BASE_VAR_TYPE_STRING,
} mca_base_var_type_t;
typedef enum {
    MCA_BASE_VAR_SCOPE_CONSTANT,
    MCA_BASE_VAR_SCOPE_READONLY,
    MCA_BASE_VAR_SCOPE_LOCAL,
} mca_base_var_scope_t;
typedef enum {
    OPAL_INFO_LVL_1,
    OPAL_INFO_LVL_2,
    OPAL_INFO_LVL_3,
    OPAL_INFO_LVL_4,
    OPAL_INFO_LVL_5,
    OPAL_INFO_LVL_6,
    OPAL_INFO_LVL_7,
    OPAL_INFO_LVL_8,
    OPAL_INFO_LVL_9,
} mca_base_var_info_lvl_t;
struct mca_base_var_enum_t;
OPAL_DECLSPEC int mca_base_component_var_register(const mca_base_component_t *component,
                                                  const char *variable_name,
                                                  const char *description,
                                                  mca_base_var_type_t type,
                                                  struct mca_base_var_enum_t *enumerator,
                                                  int bind, int flags,
                                                  mca_base_var_info_lvl_t info_lvl,
                                                  mca_base_var_scope_t scope, void *storage);

/* ---- opal/mca/btl/btl.h (interface 3.3) ----------------------------------------------- */
typedef uint8_t mca_btl_base_tag_t;
#define MCA_BTL_NO_ORDER 255
#define MCA_BTL_TAG_MAX 255

#define MCA_BTL_FLAGS_SEND 0x0001
#define MCA_BTL_FLAGS_PUT 0x0002
#define MCA_BTL_FLAGS_GET 0x0004
#define MCA_BTL_FLAGS_SEND_INPLACE 0x0008

#define MCA_BTL_EXCLUSIVITY_LOW 0
#define MCA_BTL_ERROR_FLAGS_FATAL 0x1
#define MCA_BTL_ERROR_FLAGS_NONFATAL 0x2

#define MCA_BTL_DES_FLAGS_PRIORITY 0x0001
#define MCA_BTL_DES_FLAGS_BTL_OWNERSHIP 0x0002
#define MCA_BTL_DES_SEND_ALWAYS_CALLBACK 0x0004

/* MCA_RCACHE_ACCESS_REMOTE_READ / _WRITE */
#define MCA_BTL_REG_FLAG_LOCAL_WRITE 0x01
#define MCA_BTL_REG_FLAG_REMOTE_READ 0x02
#define MCA_BTL_REG_FLAG_REMOTE_WRITE 0x04

struct mca_btl_base_module_t;
struct mca_btl_base_endpoint_t;
struct mca_btl_base_descriptor_t;
struct mca_btl_base_registration_handle_t;
typedef struct mca_btl_base_registration_handle_t mca_btl_base_registration_handle_t;
struct mca_mpool_base_module_t;

typedef void (*mca_btl_base_completion_fn_t)(struct mca_btl_base_module_t *module,
                                             struct mca_btl_base_endpoint_t *endpoint,
                                             struct mca_btl_base_descriptor_t *descriptor,
                                             int status);
typedef void (*mca_btl_base_rdma_completion_fn_t)(
    struct mca_btl_base_module_t *module, struct mca_btl_base_endpoint_t *endpoint,
    void *local_address, struct mca_btl_base_registration_handle_t *local_handle, void *context,
    void *cbdata, int status);

typedef struct mca_btl_base_segment_t {
    opal_ptr_t seg_addr;
    uint64_t seg_len;
} mca_btl_base_segment_t;

typedef struct mca_btl_base_descriptor_t {
    opal_free_list_item_t super;
    mca_btl_base_segment_t *des_segments;
    size_t des_segment_count;
    mca_btl_base_completion_fn_t des_cbfunc;
    void *des_cbdata;
    void *des_context;
    uint32_t des_flags;
    uint8_t order;
} mca_btl_base_descriptor_t;
OPAL_DECLSPEC extern opal_class_t mca_btl_base_descriptor_t_class;

/* 3.3: a receive callback gets one descriptor with the endpoint, the segments and the tag. */
typedef struct mca_btl_base_receive_descriptor_t {
    struct mca_btl_base_endpoint_t *endpoint;
    const mca_btl_base_segment_t *des_segments;
    size_t des_segment_count;
    mca_btl_base_tag_t tag;
    void *cbdata;
} mca_btl_base_receive_descriptor_t;

typedef struct mca_btl_base_module_t **(*mca_btl_base_component_init_fn_t)(
    int *num_btls, bool enable_progress_threads, bool enable_mpi_threads);
typedef int (*mca_btl_base_component_progress_fn_t)(void);
typedef void (*mca_btl_base_module_recv_cb_fn_t)(
    struct mca_btl_base_module_t *btl, const mca_btl_base_receive_descriptor_t *descriptor);

typedef struct mca_btl_active_message_callback_t {
    mca_btl_base_module_recv_cb_fn_t cbfunc;
    void *cbdata;
} mca_btl_active_message_callback_t;
OPAL_DECLSPEC extern mca_btl_active_message_callback_t
    mca_btl_base_active_message_trigger[MCA_BTL_TAG_MAX];

typedef struct mca_btl_base_component_3_0_0_t {
    mca_base_component_t btl_version;
    mca_base_component_data_t btl_data;
    mca_btl_base_component_init_fn_t btl_init;
    mca_btl_base_component_progress_fn_t btl_progress;
} mca_btl_base_component_3_0_0_t;
typedef mca_btl_base_component_3_0_0_t mca_btl_base_component_t;

typedef int (*mca_btl_base_module_finalize_fn_t)(struct mca_btl_base_module_t *btl);
typedef int (*mca_btl_base_module_add_procs_fn_t)(struct mca_btl_base_module_t *btl,
                                                  size_t nprocs, struct opal_proc_t **procs,
                                                  struct mca_btl_base_endpoint_t **endpoints,
                                                  struct opal_bitmap_t *reachable);
typedef int (*mca_btl_base_module_del_procs_fn_t)(struct mca_btl_base_module_t *btl,
                                                  size_t nprocs, struct opal_proc_t **procs,
                                                  struct mca_btl_base_endpoint_t **peer);
typedef int (*mca_btl_base_module_register_fn_t)(struct mca_btl_base_module_t *btl,
                                                 mca_btl_base_tag_t tag,
                                                 mca_btl_base_module_recv_cb_fn_t cbfunc,
                                                 void *cbdata);
typedef void (*mca_btl_base_module_error_cb_fn_t)(struct mca_btl_base_module_t *btl,
                                                  int32_t flags, struct opal_proc_t *errproc,
                                                  char *btlinfo);
typedef int (*mca_btl_base_module_register_error_fn_t)(
    struct mca_btl_base_module_t *btl, mca_btl_base_module_error_cb_fn_t cbfunc);
typedef mca_btl_base_descriptor_t *(*mca_btl_base_module_alloc_fn_t)(
    struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint, uint8_t order,
    size_t size, uint32_t flags);
typedef int (*mca_btl_base_module_free_fn_t)(struct mca_btl_base_module_t *btl,
                                             mca_btl_base_descriptor_t *descriptor);
typedef struct mca_btl_base_descriptor_t *(*mca_btl_base_module_prepare_fn_t)(
    struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
    struct opal_convertor_t *convertor, uint8_t order, size_t reserve, size_t *size,
    uint32_t flags);
typedef struct mca_btl_base_registration_handle_t *(*mca_btl_base_module_register_mem_fn_t)(
    struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint, void *base,
    size_t size, uint32_t flags);
typedef int (*mca_btl_base_module_deregister_mem_fn_t)(
    struct mca_btl_base_module_t *btl, struct mca_btl_base_registration_handle_t *handle);
typedef int (*mca_btl_base_module_send_fn_t)(struct mca_btl_base_module_t *btl,
                                             struct mca_btl_base_endpoint_t *endpoint,
                                             struct mca_btl_base_descriptor_t *descriptor,
                                             mca_btl_base_tag_t tag);
typedef int (*mca_btl_base_module_sendi_fn_t)(
    struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
    struct opal_convertor_t *convertor, void *header, size_t header_size, size_t payload_size,
    uint8_t order, uint32_t flags, mca_btl_base_tag_t tag,
    mca_btl_base_descriptor_t **descriptor);
typedef int (*mca_btl_base_module_put_fn_t)(
    struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
    void *local_address, uint64_t remote_address,
    struct mca_btl_base_registration_handle_t *local_handle,
    struct mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags, int order,
    mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata);
typedef mca_btl_base_module_put_fn_t mca_btl_base_module_get_fn_t;
/* Entries the component leaves NULL: their exact types do not matter, their size does. */
typedef void (*mca_btl_base_module_unused_fn_t)(void);
typedef int (*mca_btl_base_module_flush_fn_t)(struct mca_btl_base_module_t *btl,
                                              struct mca_btl_base_endpoint_t *endpoint);

typedef struct mca_btl_base_module_t {
    mca_btl_base_component_t *btl_component;
    size_t btl_eager_limit;
    size_t btl_rndv_eager_limit;
    size_t btl_max_send_size;
    size_t btl_rdma_pipeline_send_length;
    size_t btl_rdma_pipeline_frag_size;
    size_t btl_min_rdma_pipeline_size;
    uint32_t btl_exclusivity;
    uint32_t btl_latency;
    uint32_t btl_bandwidth;
    uint32_t btl_flags;
    uint32_t btl_atomic_flags;
    size_t btl_registration_handle_size;
    size_t btl_get_limit;
    size_t btl_get_alignment;
    size_t btl_put_limit;
    size_t btl_put_alignment;
    size_t btl_get_local_registration_threshold;
    size_t btl_put_local_registration_threshold;

    mca_btl_base_module_add_procs_fn_t btl_add_procs;
    mca_btl_base_module_del_procs_fn_t btl_del_procs;
    mca_btl_base_module_register_fn_t btl_register;
    mca_btl_base_module_finalize_fn_t btl_finalize;
    mca_btl_base_module_alloc_fn_t btl_alloc;
    mca_btl_base_module_free_fn_t btl_free;
    mca_btl_base_module_prepare_fn_t btl_prepare_src;
    mca_btl_base_module_send_fn_t btl_send;
    mca_btl_base_module_sendi_fn_t btl_sendi;
    mca_btl_base_module_put_fn_t btl_put;
    mca_btl_base_module_get_fn_t btl_get;
    mca_btl_base_module_unused_fn_t btl_dump;
    mca_btl_base_module_unused_fn_t btl_atomic_op;
    mca_btl_base_module_unused_fn_t btl_atomic_fop;
    mca_btl_base_module_unused_fn_t btl_atomic_cswap;
    mca_btl_base_module_register_mem_fn_t btl_register_mem;
    mca_btl_base_module_deregister_mem_fn_t btl_deregister_mem;
    struct mca_mpool_base_module_t *btl_mpool;
    mca_btl_base_module_register_error_fn_t btl_register_error;
    /* (OPAL_CUDA_GDR_SUPPORT builds: two size_t accelerator limits here; not these.) */
    size_t btl_accelerator_max_send_size;
    mca_btl_base_module_flush_fn_t btl_flush;
    union {
        struct {
            void *btl_am_data;
        };
        unsigned char padding[256];
    };
} mca_btl_base_module_t;

OPAL_DECLSPEC int mca_btl_base_param_register(mca_base_component_t *version,
                                              mca_btl_base_module_t *module);

#define MCA_BTL_DEFAULT_VERSION(name)                                                      \
    .mca_major_version = 2, .mca_minor_version = 1, .mca_release_version = 0,               \
    .mca_project_name = "opal", .mca_project_major_version = OPAL_MAJOR_VERSION,            \
    .mca_project_minor_version = OPAL_MINOR_VERSION,                                        \
    .mca_project_release_version = OPAL_RELEASE_VERSION, .mca_type_name = "btl",            \
    .mca_type_major_version = 3, .mca_type_minor_version = 3, .mca_type_release_version = 0, \
    .mca_component_name = name, .mca_component_major_version = OPAL_MAJOR_VERSION,          \
    .mca_component_minor_version = OPAL_MINOR_VERSION,                                      \
    .mca_component_release_version = OPAL_RELEASE_VERSION

/* Sizes in this build of Open MPI 5.0 that ringbtl_compat_check compares with the
 * library's: the structures the component embeds or indexes, and btl tcp's module as a
 * witness of mca_btl_base_module_t (btl_tcp.h: the base module, then 280 bytes of its own
 * fields in a build without debugging). */
#define RINGBTL_OMPI5_TCP_MODULE_TAIL 280

END_C_DECLS

#endif
