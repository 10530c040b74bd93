/* C API of the ZeRO-3 parameter-block manager (docs/zero3.md, "C API").
 *
 * A thin layer over fragctl::zero3::block_manager (block_manager.hpp states
 * the semantics), in the shape of the rest of the C API (fragctl.h): nothing
 * here throws, every call returns a fragctl_status, and on failure
 * fragctl_last_error() gives the message. One thread drives one manager.
 *
 * Memory. The manager allocates from two allocator handles of fragctl_create
 * (any policy and backend; statistics, limits and reports are theirs): the
 * long-lived one (shards, persistent parameters, gradient slices, reduce
 * buckets) and the transient one (gathered blocks). They may be the same
 * handle, e.g. a process-default allocator shared with the framework
 * (fragctl.torch.enable's). Both must be on one backend and device, which is
 * the manager's (collectives bind that device). The manager counts itself a
 * dependent of each until fragctl_zero3_destroy: fragctl_destroy refuses
 * them with FRAGCTL_ERROR_STATE meanwhile.
 *
 *   fragctl_allocator* a = NULL;
 *   fragctl_create("caching", NULL, "cuda", 0, &a);
 *   fragctl_zero3* z = NULL;
 *   fragctl_zero3_create(a, a, "stage3_max_live_parameters:2e8", "nccl:rank=0,size=2,id_file=/tmp/job/id", &z);
 *   fragctl_zero3_add_block(z, "layer.0", params, 9);  ... one per block, in execution order
 *   fragctl_zero3_start(z);                             lays out and allocates the shards
 *   fragctl_zero3_fetch(z, 0, stream, ptrs, sizes, 9);  ... use, then
 *   fragctl_zero3_release(z, 0, stream);
 *   fragctl_zero3_destroy(z); fragctl_destroy(a);
 *
 * Statuses besides fragctl.h's usual ones: FRAGCTL_ERROR_BUDGET (a fetch
 * needs more than max_live_bytes leaves), FRAGCTL_ERROR_COLLECTIVE (a
 * collective failed; the communicator is aborted), FRAGCTL_ERROR_TIMEOUT (a
 * collective passed its deadline; aborted), FRAGCTL_ERROR_BACKEND (the GPU
 * runtime or NCCL/RCCL failed or is missing).
 */
#ifndef FRAGCTL_ZERO3_ZERO3_H
#define FRAGCTL_ZERO3_ZERO3_H

#include <stddef.h>

#include "fragctl/fragctl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fragctl_zero3 fragctl_zero3;

typedef struct fragctl_zero3_param {
  const char* name;
  size_t elements;
  size_t element_bytes; /* 2 for bf16/fp16 */
  int trainable;        /* 0: frozen (no gradient) */
} fragctl_zero3_param;

/* Creates a manager on `long_lived` and `transient` (the same handle or two
 * on one backend and device). `options`: zero3 options ("key:value,..." as
 * parse_options takes, NULL or "" for defaults). `communicator`:
 *   "local"                      one rank (threads on sim, NCCL/RCCL of size 1 on a GPU)
 *   "nccl:rank=R,size=N[,id_file=PATH][,timeout_ms=T][,library=PATH]"
 *   "rccl:..."                   the same with RCCL
 * Without id_file the unique id is read from FRAGCTL_NCCL_UNIQUE_ID. */
FRAGCTL_API fragctl_status fragctl_zero3_create(fragctl_allocator* long_lived, fragctl_allocator* transient,
                                                const char* options, const char* communicator, fragctl_zero3** out);
/* Collectives run by the caller (fragctl.torch.zero3 passes torch.distributed's).
 * Each function runs one grouped operation and returns FRAGCTL_OK when it is
 * queued on `stream` (or done), FRAGCTL_ERROR_COLLECTIVE when it failed,
 * FRAGCTL_ERROR_TIMEOUT when it passed the caller's deadline; the manager then
 * fails with that status and a message naming the rank, the operation and
 * `tag` (the block). all_gather: for each part, recv receives `bytes` from
 * every rank, rank r's at recv + r * bytes (in place when send == recv +
 * rank * bytes). reduce_scatter (sum): recv = the sum over ranks of their
 * send[rank * elements, (rank + 1) * elements) of `type`. */
typedef struct fragctl_zero3_gather_part {
  const void* send;
  void* recv;
  size_t bytes; /* per rank */
} fragctl_zero3_gather_part;
typedef struct fragctl_zero3_scatter_part {
  const void* send;
  void* recv;
  size_t elements; /* per rank */
} fragctl_zero3_scatter_part;
typedef enum fragctl_zero3_type {
  FRAGCTL_ZERO3_UINT8 = 0,
  FRAGCTL_ZERO3_FLOAT16 = 1,
  FRAGCTL_ZERO3_BFLOAT16 = 2,
  FRAGCTL_ZERO3_FLOAT32 = 3
} fragctl_zero3_type;
typedef struct fragctl_zero3_collectives {
  int rank;
  int size;
  long long timeout_ms; /* the caller's deadline, for messages */
  void* context;        /* passed to both functions */
  int (*all_gather)(void* context, const fragctl_zero3_gather_part* parts, size_t count, void* stream,
                    const char* tag);
  int (*reduce_scatter)(void* context, const fragctl_zero3_scatter_part* parts, size_t count, int type,
                        void* stream, const char* tag);
} fragctl_zero3_collectives;

/* As fragctl_zero3_create, with the caller's collectives (copied; `context`
 * must outlive the manager). */
FRAGCTL_API fragctl_status fragctl_zero3_create_with_collectives(fragctl_allocator* long_lived,
                                                                 fragctl_allocator* transient, const char* options,
                                                                 const fragctl_zero3_collectives* c,
                                                                 fragctl_zero3** out);
/* Adds a block of `count` parameters (execution order). Before start only. */
FRAGCTL_API fragctl_status fragctl_zero3_add_block(fragctl_zero3* z, const char* name,
                                                   const fragctl_zero3_param* params, size_t count);
/* Lays out the blocks and allocates the shards. */
FRAGCTL_API fragctl_status fragctl_zero3_start(fragctl_zero3* z);
/* Gathers block `block`; writes up to `capacity` parameter views. */
FRAGCTL_API fragctl_status fragctl_zero3_fetch(fragctl_zero3* z, size_t block, void* stream, void** pointers,
                                               size_t* sizes, size_t capacity);
FRAGCTL_API fragctl_status fragctl_zero3_release(fragctl_zero3* z, size_t block, void* stream);
/* Where parameter `param` of `block` has bytes in this rank's shard (for
 * loading); *pointer is NULL when the rank holds none of it. */
FRAGCTL_API fragctl_status fragctl_zero3_shard_of(fragctl_zero3* z, size_t block, size_t param,
                                                  size_t* parameter_offset, void** pointer, size_t* bytes);
/* This rank's T slice of `block` (trainable partitioned elements, in the
 * parameters' element type) and its gradient slice (gradient_type), the same
 * `elements` elements: what an optimizer steps. NULLs and 0 for a block
 * without trainable partitioned parameters. *gradient is NULL while the
 * slice is not held (before the block's first reduce, after
 * fragctl_zero3_release_gradients) and may move after a release: read it
 * again after each backward. */
FRAGCTL_API fragctl_status fragctl_zero3_trainable_shard(fragctl_zero3* z, size_t block, void** data, void** gradient,
                                                         size_t* elements);
/* A persistent parameter (whole on every rank): its data and, if trainable,
 * its replicated gradient (gradient_type; NULL when frozen). *data is NULL
 * for a partitioned parameter. */
FRAGCTL_API fragctl_status fragctl_zero3_persistent(fragctl_zero3* z, size_t block, size_t param, void** data,
                                                    void** gradient);
FRAGCTL_API fragctl_status fragctl_zero3_begin_gradients(fragctl_zero3* z, size_t block, void* stream, void** pointers,
                                                         size_t* sizes, size_t capacity);
FRAGCTL_API fragctl_status fragctl_zero3_reduce_gradients(fragctl_zero3* z, size_t block, void* stream);
FRAGCTL_API fragctl_status fragctl_zero3_finish_gradients(fragctl_zero3* z, void* stream);
/* Frees every block's gradient slice (allocated again at each block's next
 * reduce); the caller's use of them is queued on `stream`. Call after the
 * optimizer step, e.g. at zero_grad(set_to_none=True), so no gradient is held
 * during the next forward. FRAGCTL_ERROR_INVALID_ARGUMENT while a block holds
 * a reduce bucket (begin_gradients without its reduce_gradients yet). */
FRAGCTL_API fragctl_status fragctl_zero3_release_gradients(fragctl_zero3* z, void* stream);
FRAGCTL_API fragctl_status fragctl_zero3_end_step(fragctl_zero3* z, void* stream);
FRAGCTL_API fragctl_status fragctl_zero3_synchronize(fragctl_zero3* z);
/* --- The gradient path of a framework binding ----------------------------
 * (fragctl/zero3/gradient_flow.hpp states the semantics; docs/zero3.md,
 * "Gradients of a framework binding"). The binding reports each event; the
 * manager decides and answers with actions the binding does in order (the
 * tensor arithmetic), running its own operations (begin, reduce, finish,
 * release of gradients, end_step) between batches. */
typedef enum fragctl_zero3_event {
  FRAGCTL_ZERO3_APPLIED = 0,             /* forward with gradients applies `block` */
  FRAGCTL_ZERO3_UNPACKED = 1,            /* backward reads a saved parameter of `block` */
  FRAGCTL_ZERO3_ARRIVED = 2,             /* one application's gradient of parameter `param` of `block` */
  FRAGCTL_ZERO3_BACKWARD_ENDED = 3,      /* the end-of-backward callback */
  FRAGCTL_ZERO3_FORWARD = 4,             /* the root forward begins, no backward running */
  FRAGCTL_ZERO3_FORWARD_IN_BACKWARD = 5, /* the root forward begins inside a running backward */
  FRAGCTL_ZERO3_RESUME = 6               /* the last batch of actions is done */
} fragctl_zero3_event;
/* The actions (value: the gradient in hand, the one that arrived or the one
 * TAKE loaded; kept[slot]: tensors the binding keeps for the manager). */
typedef enum fragctl_zero3_gradient_do {
  FRAGCTL_ZERO3_DO_TRACK = 0,        /* report the gradient of parameter `param` of `block` */
  FRAGCTL_ZERO3_DO_FETCH = 1,        /* fetch `block` for backward (a RELEASE ends it) */
  FRAGCTL_ZERO3_DO_QUEUE_END = 2,    /* queue the end-of-backward callback */
  FRAGCTL_ZERO3_DO_REPORT = 3,       /* pass gradients_set with the next RESUME */
  FRAGCTL_ZERO3_DO_CARRY = 4,        /* kept[slot] = a copy of shard `shard`'s gradient */
  FRAGCTL_ZERO3_DO_ZERO_VIEW = 5,    /* zero shard `shard`'s gradient view */
  FRAGCTL_ZERO3_DO_KEEP = 6,         /* kept[slot] = value */
  FRAGCTL_ZERO3_DO_ADD_KEPT = 7,     /* value = kept[slot] + value; drop kept[slot] */
  FRAGCTL_ZERO3_DO_TAKE = 8,         /* value = kept[slot]; drop kept[slot] */
  FRAGCTL_ZERO3_DO_DROP = 9,         /* drop kept[slot] */
  FRAGCTL_ZERO3_DO_BUCKET_COPY = 10, /* the bucket view at `pointer` (parameter `param` of `block`) = value / world size */
  FRAGCTL_ZERO3_DO_BUCKET_ADD = 11,  /* that view += value / world size */
  FRAGCTL_ZERO3_DO_BUCKET_ZERO = 12, /* that view = 0 */
  FRAGCTL_ZERO3_DO_KEEP_SLICE = 13,  /* kept[slot] = a copy of `elements` elements at `pointer` */
  FRAGCTL_ZERO3_DO_ADD_SLICE = 14,   /* kept[slot] = kept[slot] + the `elements` elements at `pointer` */
  FRAGCTL_ZERO3_DO_RELEASE = 15,     /* release `block` */
  FRAGCTL_ZERO3_DO_BIND = 16,        /* shard `shard`'s view = `elements` elements at `pointer` (none if NULL) */
  FRAGCTL_ZERO3_DO_BIND_KEPT = 17,   /* shard `shard`'s view = kept[slot]; drop kept[slot] */
  FRAGCTL_ZERO3_DO_ADD_TO_VIEW = 18, /* shard `shard`'s view += kept[slot]; drop kept[slot] */
  FRAGCTL_ZERO3_DO_SET_GRAD = 19     /* shard `shard`'s gradient = its view */
} fragctl_zero3_gradient_do;
typedef struct fragctl_zero3_gradient_action {
  int what; /* fragctl_zero3_gradient_do */
  size_t block;
  size_t param;
  size_t shard;
  size_t slot;
  void* pointer;
  size_t elements;
} fragctl_zero3_gradient_action;
/* Reports `event` and writes up to `capacity` (at least 1) actions to do now
 * into `actions`, their number into *count, and into *more whether to report
 * FRAGCTL_ZERO3_RESUME once they are done. `gradients_set`: `shards` bytes,
 * nonzero where the shard's gradient is set, in the shards' order (per block:
 * its trainable slice, then its persistent trainable parameters); given with
 * FORWARD, FORWARD_IN_BACKWARD and the RESUME after a REPORT, else NULL and
 * 0. `stream`: the binding's current stream. FRAGCTL_ERROR_INVALID_ARGUMENT
 * for a bad event, block, parameter or shard count; a failed manager
 * operation returns its status, and the event's remaining actions are
 * dropped. */
FRAGCTL_API fragctl_status fragctl_zero3_gradient_event(fragctl_zero3* z, int event, size_t block, size_t param,
                                                        void* stream, const unsigned char* gradients_set,
                                                        size_t shards, fragctl_zero3_gradient_action* actions,
                                                        size_t capacity, size_t* count, int* more);
/* --- end of the gradient path ------------------------------------------------ */
/* The statistics as the JSON object of docs/zero3.md ("Statistics"); release
 * *json with fragctl_string_free. */
FRAGCTL_API fragctl_status fragctl_zero3_stats_json(fragctl_zero3* z, char** json);
/* The options' defaults as a JSON object, DeepSpeed's keys in its units
 * (elements): stage3_max_live_parameters, stage3_prefetch_bucket_size,
 * stage3_param_persistence_threshold, reduce_bucket_size; and alignment
 * (bytes). Release *json with fragctl_string_free. */
FRAGCTL_API fragctl_status fragctl_zero3_default_options_json(char** json);
/* Records a collective of the caller's (fragctl_zero3_create_with_collectives)
 * that passed its deadline in this process's reports (docs/reports.md,
 * "Hangs"): `record` is one JSON object (the collective, its number, block
 * and modules, the ranks that had not entered it and where each last was,
 * the deadline, the time waited). Every JSON report (FRAGCTL_REPORT) the
 * process writes from now on carries it under "hangs"; they are rewritten
 * now, since the process is likely to end. The manager's own communicators
 * (threads, NCCL, RCCL) record their hangs themselves. INVALID_ARGUMENT for
 * text that is not a JSON object; IO when a report could not be written. */
FRAGCTL_API fragctl_status fragctl_zero3_record_hang(fragctl_zero3* z, const char* record);
/* Frees the manager and its memory (into its allocators). NULL is accepted. */
FRAGCTL_API void fragctl_zero3_destroy(fragctl_zero3* z);

#ifdef __cplusplus
}
#endif

#endif /* FRAGCTL_ZERO3_ZERO3_H */
