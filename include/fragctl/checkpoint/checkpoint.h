/* C API of the activation-checkpoint store (docs/checkpoint.md, "C API").
 *
 * A thin layer over fragctl::checkpoint::store (store.hpp states the
 * semantics: the stream contract, eviction, prefetch). Nothing here throws:
 * every call returns a fragctl_status, and on failure fragctl_last_error()
 * gives the message, as for the rest of the C API (fragctl.h).
 *
 * The store takes its device region from an allocator of fragctl_create
 * (any policy and backend); the allocator must outlive the store
 * (fragctl_destroy refuses it with FRAGCTL_ERROR_STATE while the store lives). One thread
 * drives one store at a time.
 *
 *   fragctl_allocator* a = NULL;
 *   fragctl_create("caching", NULL, "cuda", 0, &a);
 *   fragctl_checkpoint_store* s = NULL;
 *   fragctl_checkpoint_create(a, (size_t)2 << 30, 2, 1, &s);
 *   fragctl_checkpoint_put(s, layer, bytes, stream, &p);    forward: write p on stream
 *   fragctl_checkpoint_get(s, layer, stream, &p);           backward: read p on stream
 *   fragctl_checkpoint_drop(s, layer);
 *   fragctl_checkpoint_reset(s);                            end of the iteration
 *   fragctl_checkpoint_destroy(s); fragctl_destroy(a);
 */
#ifndef FRAGCTL_CHECKPOINT_CHECKPOINT_H
#define FRAGCTL_CHECKPOINT_CHECKPOINT_H

#include <stddef.h>

#include "fragctl/fragctl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fragctl_checkpoint_store fragctl_checkpoint_store;

/** Where a checkpoint is (fragctl_checkpoint_where). Values are stable. */
typedef enum fragctl_checkpoint_residence {
  FRAGCTL_CHECKPOINT_ABSENT = 0,
  FRAGCTL_CHECKPOINT_DEVICE = 1,
  FRAGCTL_CHECKPOINT_HOST = 2
} fragctl_checkpoint_residence;

/** What the store rounds its region and every checkpoint up to, and aligns
 * every checkpoint's buffer to, in bytes (512). */
FRAGCTL_API size_t fragctl_checkpoint_alignment(void);

/** Creates a store whose device region (`device_budget` bytes, > 0, rounded
 * up to fragctl_checkpoint_alignment()) is allocated from `allocator` now. `prefetch_depth`: checkpoints
 * fetched ahead in backward (0: on demand only); `evict_ahead` != 0 makes room
 * for the next put one put early from the second iteration. The pinned host
 * tier picks its provider automatically. Errors: INVALID_ARGUMENT (NULL
 * argument, zero budget), OUT_OF_MEMORY (the region does not fit), BACKEND. */
FRAGCTL_API fragctl_status fragctl_checkpoint_create(fragctl_allocator* allocator, size_t device_budget,
                                                     size_t prefetch_depth, int evict_ahead,
                                                     fragctl_checkpoint_store** out);

/** Waits for every stream that used the region, then frees it. NULL is accepted. */
FRAGCTL_API void fragctl_checkpoint_destroy(fragctl_checkpoint_store* store);

/** *ptr: a fragctl_checkpoint_alignment()-aligned device buffer of `bytes` (> 0) for `layer`'s
 * checkpoint, to be written by work queued on `stream` before the next call
 * into the store. OUT_OF_MEMORY when it cannot fit even after evicting every
 * evictable checkpoint; INVALID_ARGUMENT for zero bytes or a layer put twice; STATE while the
 * store's allocator is paused (fragctl_pause: its pages are given back), as for get. */
FRAGCTL_API fragctl_status fragctl_checkpoint_put(fragctl_checkpoint_store* store, int layer, size_t bytes,
                                                  void* stream, void** ptr);

/** *ptr: `layer`'s checkpoint, in place for work queued on `stream` after the
 * call, unmoved until the drop; queues prefetches of the layers below.
 * INVALID_ARGUMENT for an unknown layer; STATE while the store's allocator is
 * paused. Before fragctl_pause, call fragctl_checkpoint_synchronize: copies
 * the store queued on its own stream must be done before the pages go. A
 * drop while paused queues no prefetch. From a span callback of the store's
 * allocator (fragctl_watch_spans), put, get, drop and reset return STATE. */
FRAGCTL_API fragctl_status fragctl_checkpoint_get(fragctl_checkpoint_store* store, int layer, void* stream,
                                                  void** ptr);

/** Frees `layer`'s checkpoint after the work queued so far on the stream of
 * its last get (or put). Unknown layers are ignored with a warning. */
FRAGCTL_API fragctl_status fragctl_checkpoint_drop(fragctl_checkpoint_store* store, int layer);

/** Ends an iteration: drops every checkpoint left and remembers the sequence
 * of puts to plan the next iteration. */
FRAGCTL_API fragctl_status fragctl_checkpoint_reset(fragctl_checkpoint_store* store);

/** Blocks until every copy queued so far has completed. */
FRAGCTL_API fragctl_status fragctl_checkpoint_synchronize(fragctl_checkpoint_store* store);

/** Call before destroying `stream` (cudaStreamDestroy) when checkpoints were
 * put or taken on it: waits for its work, and the store never records on it
 * again (it records on a checkpoint's last stream when it seals, hands out
 * or drops it). NULL does nothing. BACKEND when the wait fails. */
FRAGCTL_API fragctl_status fragctl_checkpoint_stream_ending(fragctl_checkpoint_store* store, void* stream);

/** *where: a fragctl_checkpoint_residence value for `layer`. */
FRAGCTL_API fragctl_status fragctl_checkpoint_where(fragctl_checkpoint_store* store, int layer, int* where);

/** The store's copy stream (a CUstream / hipStream_t on a GPU). */
FRAGCTL_API fragctl_status fragctl_checkpoint_copy_stream(fragctl_checkpoint_store* store, void** stream);

/** The name of the backend the store's allocator runs on ("cuda", "hip",
 * "sim"); valid while the store lives, "" for NULL. */
FRAGCTL_API const char* fragctl_checkpoint_backend(const fragctl_checkpoint_store* store);

/** The store's statistics as the JSON object of docs/checkpoint.md
 * ("Statistics"); release *json with fragctl_string_free. */
FRAGCTL_API fragctl_status fragctl_checkpoint_stats_json(fragctl_checkpoint_store* store, char** json);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FRAGCTL_CHECKPOINT_CHECKPOINT_H */
