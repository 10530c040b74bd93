/* fragctl C API: allocators by policy name, stream-ordered malloc/free,
 * statistics as JSON, report files, and the process-default allocators that
 * the LD_PRELOAD library and PyTorch use (DESIGN.md, "Surfaces";
 * docs/integration.md).
 *
 * C-compatible (C99 and C++). No function throws: each returns a
 * fragctl_status, and on failure fragctl_last_error() gives a one-line
 * message. Streams are the runtime's stream handles (cudaStream_t, CUstream,
 * hipStream_t) passed as void*; NULL is the device's default (legacy) stream.
 * Memory is stream-ordered as with cudaMallocAsync (docs/stream-order.md):
 * a block freed on stream S may be handed out again at once on S, and on
 * another stream only once the work queued on S before the free has finished.
 *
 * Threads: every function may be called from any thread. An allocator is
 * thread-safe unless its options turn thread_safe off.
 */
#ifndef FRAGCTL_FRAGCTL_H
#define FRAGCTL_FRAGCTL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

#define FRAGCTL_API __attribute__((visibility("default")))

/** Result of every call. Values are stable (part of the ABI). */
typedef enum fragctl_status {
  FRAGCTL_OK = 0,
  FRAGCTL_ERROR_INVALID_ARGUMENT = 1, /**< bad policy, option, size, backend or a NULL out-pointer */
  FRAGCTL_ERROR_OUT_OF_MEMORY = 2,    /**< the allocator could not serve the request; message says why */
  FRAGCTL_ERROR_BACKEND = 3,          /**< the GPU runtime failed, or the backend or device is missing */
  FRAGCTL_ERROR_NOT_OWNED = 4,        /**< free of a pointer that is not a live block (or a double free) */
  FRAGCTL_ERROR_SIZE_MISMATCH = 5,    /**< free with a size other than the allocated one; the block was freed */
  FRAGCTL_ERROR_IO = 6,               /**< a report file could not be written */
  FRAGCTL_ERROR_STATE = 7,            /**< not valid now (e.g. configuring defaults that already exist) */
  FRAGCTL_ERROR_INTERNAL = 8,         /**< an unexpected failure; a bug */
  FRAGCTL_ERROR_BUDGET = 9,           /**< ZeRO-3: a fetch needs more than max_live_bytes leaves */
  FRAGCTL_ERROR_COLLECTIVE = 10,      /**< ZeRO-3: a collective failed; the communicator is aborted */
  FRAGCTL_ERROR_TIMEOUT = 11          /**< ZeRO-3: a collective passed its deadline; the communicator is aborted */
} fragctl_status;

/** An allocator: a backend, a policy chain and its adaptors. */
typedef struct fragctl_allocator fragctl_allocator;

/** Library version, "MAJOR.MINOR.PATCH". */
FRAGCTL_API const char* fragctl_version(void);

/** Symbolic name of a status ("FRAGCTL_ERROR_OUT_OF_MEMORY"). */
FRAGCTL_API const char* fragctl_status_string(fragctl_status status);

/** Message of the last failed call on this thread ("" if none). Successful
 * calls leave it unchanged. Valid until the next fragctl call on this thread. */
FRAGCTL_API const char* fragctl_last_error(void);

/** Comma-separated names of the policies FRAGCTL_POLICY offers
 * ("caching,arena,buckets,warmup"; the graph_pool pool kind is accepted by
 * fragctl_create but not listed). Static storage. */
FRAGCTL_API const char* fragctl_policy_names(void);

/** Parses a size as the options do ("4096", "512MiB", "2GiB", "1.5GiB") into
 * *bytes. INVALID_ARGUMENT, with a message saying what is accepted, for
 * anything else or a NULL argument. */
FRAGCTL_API fragctl_status fragctl_parse_size(const char* text, size_t* bytes);

/* --- Allocators ------------------------------------------------------------ */

/** Creates an allocator.
 *  policy:  policy expression ("arena", "warmup:buckets:arena"); NULL or ""
 *           for the default ("arena" with virtual memory, else "caching").
 *  options: FRAGCTL_CONF syntax, "key:value,key:value"; NULL or "" for none
 *           (docs/configuration.md lists the keys).
 *  backend: "cuda", "hip", "sim" or "auto"; NULL means "auto".
 *  device:  device ordinal; -1 takes the options' `device` key (default 0).
 * The environment is not read. On success *out is the allocator; release it
 * with fragctl_destroy. Errors: INVALID_ARGUMENT (message names the key and
 * what it accepts), BACKEND (runtime or device missing). */
FRAGCTL_API fragctl_status fragctl_create(const char* policy, const char* options, const char* backend,
                                          int device, fragctl_allocator** out);

/** Creates an allocator for `device` from FRAGCTL_POLICY, FRAGCTL_BACKEND,
 * FRAGCTL_CONF, FRAGCTL_REPORT, FRAGCTL_TRACE and FRAGCTL_LOG_LEVEL. */
FRAGCTL_API fragctl_status fragctl_create_from_environment(int device, fragctl_allocator** out);

/** Destroys an allocator from fragctl_create*; its FRAGCTL_REPORT file, if
 * any, is written one last time. Every block must have been freed and no
 * queued work may use its memory. NULL is accepted. A process-default
 * allocator cannot be destroyed (INVALID_ARGUMENT); nor can one a checkpoint
 * store (fragctl_checkpoint_create) or a ZeRO-3 manager
 * (fragctl_zero3_create, fragctl/zero3/zero3.h) still uses, or one a block
 * was imported through and not closed (fragctl_import_block) (STATE:
 * destroy the store or the manager, or close the block, first; the
 * allocator is left as it was). */
FRAGCTL_API fragctl_status fragctl_destroy(fragctl_allocator* allocator);

/** Allocates `bytes` usable by work on `stream` from now on; at least
 * 512-byte aligned. bytes == 0 gives *ptr = NULL and FRAGCTL_OK. */
FRAGCTL_API fragctl_status fragctl_malloc(fragctl_allocator* allocator, void** ptr, size_t bytes,
                                          void* stream);

/** Frees `ptr` (from fragctl_malloc with `bytes`) stream-ordered on `stream`:
 * all work using it must be queued on `stream` before this call. NULL does
 * nothing. A foreign pointer or double free changes nothing and returns
 * NOT_OWNED; a wrong size frees the block and returns SIZE_MISMATCH. Both are
 * counted as misuse in the statistics. */
FRAGCTL_API fragctl_status fragctl_free(fragctl_allocator* allocator, void* ptr, size_t bytes, void* stream);

/** Declares that work queued on `stream` uses `ptr`, a live block of this
 * allocator (PyTorch's Tensor.record_stream): when `ptr` is freed later, on
 * whatever stream, the block is neither handed out again nor given back to
 * the device until `stream` has passed the point of the free. Costs nothing
 * at free time (one event per stream is recorded when someone asks). A
 * pointer where no live block of this allocator starts (another allocator's,
 * an interior or freed one) records nothing and returns OK, as PyTorch's
 * recordStream skips a pointer that is not its own. */
FRAGCTL_API fragctl_status fragctl_record_stream(fragctl_allocator* allocator, void* ptr, void* stream);

/** Call before destroying `stream` (cudaStreamDestroy, hipStreamDestroy) when
 * blocks of this allocator were allocated, freed or recorded on it: waits for
 * the work queued on it, then the allocator forgets the handle (its frees are
 * complete, its cached blocks go to the default stream), so that it never
 * hands the destroyed handle to the runtime, which may end the process. A
 * stream later created with the same handle is a new one. NULL (the default
 * stream) does nothing. The preload library does it in cudaStreamDestroy
 * itself. BACKEND when the wait fails (nothing forgotten then). */
FRAGCTL_API fragctl_status fragctl_stream_ending(fragctl_allocator* allocator, void* stream);

/** What the addresses an allocator hands out refer to. Values are stable
 * (part of the ABI). */
typedef enum fragctl_memory_kind {
  FRAGCTL_MEMORY_NONE = 0,  /**< nothing: the sim backend in accounting mode (sim_backed:false, its default)
                                 hands out addresses without memory; never read or write through them */
  FRAGCTL_MEMORY_HOST = 1,  /**< host memory the CPU reads and writes: the sim backend with sim_backed:true */
  FRAGCTL_MEMORY_DEVICE = 2 /**< GPU memory (cuda, hip): for the device's kernels and copies, not the CPU */
} fragctl_memory_kind;

/** Sets *kind to what `allocator`'s blocks are: whether a CPU tensor, a GPU
 * tensor or nothing may live in them (fragctl.torch refuses an allocator
 * whose memory its tensors cannot use). INVALID_ARGUMENT for a NULL
 * argument. */
FRAGCTL_API fragctl_status fragctl_memory_kind_of(fragctl_allocator* allocator, fragctl_memory_kind* kind);

/** Sets *kind to what the blocks of an allocator built from the environment
 * (FRAGCTL_BACKEND, FRAGCTL_CONF, as fragctl_create_from_environment builds
 * them) would be. Builds the backend (so "auto" finds
 * its device) and no policy: nothing is allocated, no report or trace is
 * opened. INVALID_ARGUMENT for a bad environment, BACKEND when the backend
 * cannot be opened. */
FRAGCTL_API fragctl_status fragctl_environment_memory_kind(fragctl_memory_kind* kind);

/** Returns every wholly free cached block to the device. */
FRAGCTL_API fragctl_status fragctl_release_cached(fragctl_allocator* allocator);

/** What fragctl_pause keeps of the live blocks' contents. */
typedef enum fragctl_pause_keep {
  FRAGCTL_PAUSE_KEEP_NONE = 0, /**< nothing: contents are undefined after fragctl_resume */
  FRAGCTL_PAUSE_KEEP_HOST = 1  /**< a copy in pinned host memory, written back by fragctl_resume */
} fragctl_pause_keep;

/** Gives the physical memory under every block of `allocator` back to the
 * device while keeping each block's address, so that another process or
 * library can use it (a trainer and an inference engine taking turns on one
 * GPU; docs/interop.md). The caller must first have synchronized the work
 * that uses the blocks (every stream; fragctl.torch.pause synchronizes the
 * device): the pause waits only for pending frees, then copies and unmaps.
 * Until fragctl_resume, fragctl_malloc fails with STATE; frees are
 * taken. OUT_OF_MEMORY when pinned host memory for FRAGCTL_PAUSE_KEEP_HOST
 * runs out (nothing is released but the cache); STATE when already paused
 * (also for the thread that loses when two pause at once);
 * INVALID_ARGUMENT when the policy cannot pause (only `arena`, over virtual
 * memory, can); BACKEND when a runtime call fails: with the contents kept,
 * what was released is mapped back with them where possible; without, it
 * stays paused; fragctl_paused says whether a fragctl_resume is needed. */
FRAGCTL_API fragctl_status fragctl_pause(fragctl_allocator* allocator, int keep /* fragctl_pause_keep */);

/** Maps fresh physical memory under every paused block, at the same
 * addresses, and writes back what fragctl_pause kept; CUDA graphs captured
 * before the pause replay into the same addresses. OUT_OF_MEMORY when the
 * device refuses the memory: nothing stays mapped, the allocator stays
 * paused, and fragctl_resume may be called again. STATE when not paused
 * (also for the thread that loses when two resume at once). */
FRAGCTL_API fragctl_status fragctl_resume(fragctl_allocator* allocator);

/** Sets *paused to 1 while fragctl_pause holds the allocator, else 0. */
FRAGCTL_API fragctl_status fragctl_paused(fragctl_allocator* allocator, int* paused);

/** Lets kernels on device `peer` read and write the allocator's memory
 * directly, as cudaDeviceEnablePeerAccess does for cudaMalloc memory: the
 * arena grants `peer` access to every span it has mapped and maps later
 * (caching's plain allocations need nothing more than the runtime's own peer
 * access). Call it once the program enabled peer access (fragctl.torch's
 * native route does, from PyTorch's enablePeerAccess). Idempotent; after a
 * failure it may be called again. Every policy refuses the same bad peers:
 * INVALID_ARGUMENT for the allocator's own device or a negative ordinal;
 * BACKEND when `peer` does not exist or the devices cannot access each
 * other (the message says which). */
FRAGCTL_API fragctl_status fragctl_enable_peer_access(fragctl_allocator* allocator, int peer);

/** What a fragctl_span_callback reports (fragctl_watch_spans). */
typedef enum fragctl_span_event {
  FRAGCTL_SPAN_MAPPED = 0,   /**< the span is usable from now on */
  FRAGCTL_SPAN_UNMAPPING = 1 /**< the span is about to be unmapped or freed (still usable during the call) */
} fragctl_span_event;

/** Receives span events: `event` is a fragctl_span_event. Runs inside the
 * allocator call that maps or unmaps (fragctl_malloc, fragctl_free,
 * fragctl_release_cached, fragctl_pause, ...), on its thread, under that
 * call's lock; it may call fragctl_spans, and the calls on the same allocator
 * that would take the lock return STATE instead of waiting for it
 * (fragctl_malloc, fragctl_free, fragctl_stats_json, fragctl_get_counters,
 * fragctl_paused, fragctl_memory_map, fragctl_write_report, fragctl_destroy,
 * and the calls of a checkpoint store or ZeRO-3 manager built on it, ...),
 * also from a callback of another allocator running inside it. It must not
 * unwind (a C++ callback catches its exceptions). */
typedef void (*fragctl_span_callback)(int event, uint64_t address, uint64_t size, void* context);

/** Watches the physical spans of the allocator's memory, for libraries that
 * register memory by range (NCCL's ncclCommRegister, through PyTorch's
 * allocator trace trackers): one event per span, a span being one handle
 * the arena maps (after its access is granted; a range never crosses two
 * handles) or one plain device allocation; FRAGCTL_SPAN_UNMAPPING comes
 * before the unmap or free, so a registration can be taken back first.
 * Spans usable before the call are not reported (fragctl_spans lists them).
 * One watcher per allocator: a call replaces the previous one; a NULL
 * callback stops. INVALID_ARGUMENT for a NULL allocator. */
FRAGCTL_API fragctl_status fragctl_watch_spans(fragctl_allocator* allocator, fragctl_span_callback callback,
                                               void* context);

/** Calls `visit` once per span usable now (as fragctl_watch_spans defines
 * them), in address order. INVALID_ARGUMENT for a NULL allocator or visit. */
FRAGCTL_API fragctl_status fragctl_spans(fragctl_allocator* allocator,
                                         void (*visit)(uint64_t address, uint64_t size, void* context),
                                         void* context);

/* --- Sharing blocks with other processes (CUDA IPC; docs/interop.md) ------ */

/** Describes the memory under [ptr, ptr + bytes) (inside live blocks of
 * `allocator`; bytes 0 means one byte) as a handle another process passes to
 * fragctl_import_block. Arena memory gives the file descriptors of the
 * physical handles mapped there (created shareable), which stay open as long
 * as those handles live; memory from plain device allocations (caching, the
 * arena's fallback block) gives the runtime's IPC handle of the allocation,
 * in PyTorch's own form, so that a process under PyTorch's allocator opens it
 * too. *offset is ptr's offset from the start of what the importer maps.
 * The blocks must stay live while another process maps them (PyTorch's
 * reference counting of shared tensors does this). With handle NULL only
 * *handle_size is set (the bytes needed); with capacity too small, nothing
 * is written, *handle_size is set and the status is INVALID_ARGUMENT.
 * INVALID_ARGUMENT for a range that is not live memory of the allocator,
 * STATE while it is paused; BACKEND when the backend cannot share (the
 * message says why). */
FRAGCTL_API fragctl_status fragctl_export_block(fragctl_allocator* allocator, void* ptr, size_t bytes, void* handle,
                                                size_t capacity, size_t* handle_size, size_t* offset);

/** Maps, in this process, the memory a handle from fragctl_export_block
 * (here or in another process) describes, on the device of `allocator`
 * (whose backend maps it: `allocator` cannot be destroyed until the block is
 * closed); *base is where it starts (add the
 * export's offset). File descriptors of another process are taken with
 * pidfd_open and pidfd_getfd (Linux 5.6, and permission to trace the
 * exporting process: same user, and Yama's ptrace_scope allowing it). Each
 * call maps anew; release with fragctl_close_block. INVALID_ARGUMENT for a
 * handle that is not one (the message names what is wrong); BACKEND when
 * the exporter is gone, descriptors cannot be taken, or the runtime
 * refuses; OUT_OF_MEMORY when the mapping runs out of memory. */
FRAGCTL_API fragctl_status fragctl_import_block(fragctl_allocator* allocator, const void* handle, size_t handle_size,
                                                void** base);

/** Unmaps what fragctl_import_block mapped at `base` (through the backend
 * of the allocator that imported it; `allocator` may be another).
 * INVALID_ARGUMENT for an address it did not return (or one closed
 * already). */
FRAGCTL_API fragctl_status fragctl_close_block(fragctl_allocator* allocator, void* base);

/** The policy expression the allocator was built with, defaults filled in
 * ("buckets:arena"). Valid while the allocator lives. */
FRAGCTL_API const char* fragctl_policy(const fragctl_allocator* allocator);

/** Statistics as the JSON document of docs/statistics.md (schema_version 1).
 * *json is a NUL-terminated string the caller releases with fragctl_string_free. */
FRAGCTL_API fragctl_status fragctl_stats_json(fragctl_allocator* allocator, char** json);

/** The statistics as plain numbers, for callers that read them often
 * (PyTorch's torch.cuda.memory_stats). Bytes unless said otherwise; the
 * meaning of each is docs/statistics.md's. `peak` fields cover the
 * allocator's life; `window_peak` fields the time since the last
 * fragctl_reset_peaks. Fields may be added at the end; a caller sets
 * `struct_size` to sizeof(fragctl_counters) and fields past it are left. */
typedef struct fragctl_counters {
  uint64_t struct_size;
  uint64_t requested, requested_peak, requested_window_peak, requested_total, requested_freed_total;
  uint64_t allocated, allocated_peak, allocated_window_peak, allocated_total, allocated_freed_total;
  uint64_t reserved, reserved_peak, reserved_window_peak, reserved_total, reserved_freed_total;
  uint64_t allocations, frees, live_blocks_window_peak; /**< counts */
  uint64_t ooms, retries;                               /**< counts */
  uint64_t device_allocations, device_frees;            /**< backend calls that take / give back memory */
  uint64_t segments;                                    /**< segments or mapped regions held now */
  uint64_t cached_free, largest_free_block;             /**< reserved and not handed out; largest such block */
  uint64_t limit;                                       /**< fragctl_set_limit's cap, 0 for none */
} fragctl_counters;

/** Fills `out` (whose struct_size the caller set). */
FRAGCTL_API fragctl_status fragctl_get_counters(fragctl_allocator* allocator, fragctl_counters* out);

/** Starts a new window for the window_peak counters (they become the current
 * values). The lifetime peaks, and the reports, are unchanged. */
FRAGCTL_API fragctl_status fragctl_reset_peaks(fragctl_allocator* allocator);

/** Caps the bytes the allocator hands out (after rounding) at `bytes`; an
 * allocation above it fails with OUT_OF_MEMORY. 0 removes the cap. Blocks
 * already live stay. */
FRAGCTL_API fragctl_status fragctl_set_limit(fragctl_allocator* allocator, size_t bytes);

/** What a block of a memory map is used for (fragctl_map_block.use). Values
 * are stable (part of the ABI). */
typedef enum fragctl_block_use {
  FRAGCTL_BLOCK_LIVE = 0,   /**< handed out */
  FRAGCTL_BLOCK_FREE = 1,   /**< cached, reusable on its segment's stream (or kept in a graph pool) */
  FRAGCTL_BLOCK_PENDING = 2 /**< freed on another stream, waiting for that stream's work */
} fragctl_block_use;

/** One block of a memory map; `use` is a fragctl_block_use. */
typedef struct fragctl_map_block {
  uint64_t address, size, requested;
  int use;
  void* stream;
} fragctl_map_block;

/** One segment (a region held from the device) and the blocks tiling it. */
typedef struct fragctl_map_segment {
  uint64_t address, size;
  void* stream;
  const char* pool;
  const fragctl_map_block* blocks;
  size_t block_count;
} fragctl_map_segment;

/** Calls `visit` once per segment of the allocator's memory map now, in
 * address order (docs/reports.md); the pointers are valid during the call.
 * STATE if the policy does not describe its layout. */
FRAGCTL_API fragctl_status fragctl_memory_map(fragctl_allocator* allocator,
                                              void (*visit)(const fragctl_map_segment* segment, void* context),
                                              void* context);

/** The request size (*bytes) and allocation stream (*stream) of `ptr`, a
 * live block of `allocator`, for callers that free by pointer alone: the
 * allocator keeps them when its options say block_table:true, or when its
 * policy is a graph_pool. NOT_OWNED, quietly (nothing logged or counted as
 * misuse), when `ptr` is not a live block of `allocator`; STATE when the
 * allocator keeps no live-block table; INVALID_ARGUMENT for a NULL
 * allocator or out-pointer. */
FRAGCTL_API fragctl_status fragctl_block_info(fragctl_allocator* allocator, void* ptr, size_t* bytes,
                                              void** stream);

/** Free (*free) and total (*total) memory of the allocator's device, as its
 * backend's runtime reports them now (cudaMemGetInfo for cuda; the sim
 * backend's capacity). */
FRAGCTL_API fragctl_status fragctl_device_memory(fragctl_allocator* allocator, size_t* free, size_t* total);

/** The allocator's device memory split by whose it is (docs/reports.md, "The
 * device memory that is not fragctl's"), as a JSON object in *json (release
 * it with fragctl_string_free): used, this_process and other_processes
 * (NVML; null without per-process figures), fragctl (this allocator's
 * reserved bytes), not_fragctl, other_fragctl, graph_pools, context, nccl,
 * other. */
FRAGCTL_API fragctl_status fragctl_device_memory_split_json(fragctl_allocator* allocator, char** json);

/** Records that `label` (a communicator's name) holds `bytes` of device
 * memory on the allocator's device for `use` ("nccl"), replacing what
 * `label` held before; 0 removes it. Every allocator's split on that device
 * counts it. INVALID_ARGUMENT for another use or a NULL argument. */
FRAGCTL_API fragctl_status fragctl_attribute_device_memory(fragctl_allocator* allocator, const char* use,
                                                           const char* label, size_t bytes);

/** This process's device memory on the allocator's device that no fragctl
 * allocator holds (NVML's per-process figure less every fragctl allocator's
 * reserved bytes there), in *bytes: measured before and after creating a
 * communicator, the difference is what to attribute to it. STATE where the
 * backend has no per-process figures (no NVML, HIP, a container hiding
 * this process's pid). */
FRAGCTL_API fragctl_status fragctl_process_device_memory_outside(fragctl_allocator* allocator, size_t* bytes);

/* --- Graph pools ------------------------------------------------------------ */
/* A CUDA graph's private pool is an allocator with policy "graph_pool" over a
 * base ("graph_pool:caching"; docs/policies/graph_pool.md): a block freed on
 * its allocation stream stays in the pool, reusable by later allocations of
 * the same size on that stream; the pool gives no memory back to the device
 * until it is destroyed; kept blocks count as cached in its statistics and
 * as FRAGCTL_BLOCK_FREE in its memory map. */

/** Makes `ptr`, a block kept in the graph pool `allocator` (freed, not yet
 * reused), live again at the same address with its size and stream (counted
 * as an allocation): how a pool is restored to a checkpoint. NOT_OWNED when
 * `ptr` is not kept in the pool (live, reused or handed to the base policy
 * since), INVALID_ARGUMENT when the policy is not a graph_pool. */
FRAGCTL_API fragctl_status fragctl_graph_pool_reclaim(fragctl_allocator* allocator, void* ptr);

/** Releases a string returned by fragctl. NULL is accepted. */
FRAGCTL_API void fragctl_string_free(char* text);

/** Writes a report document (docs/statistics.md, "The report file") holding
 * this allocator's statistics and, unless its options say report_map:false,
 * its memory map (docs/reports.md) to `path`, atomically. IO on failure. */
FRAGCTL_API fragctl_status fragctl_write_report(fragctl_allocator* allocator, const char* path);

/** Writes now everything the process holds for later: every trace's buffered
 * rows (FRAGCTL_TRACE) and every statistics report and Prometheus file with a
 * live allocator (reason "request"), as at exit. Call it before _exit() or
 * os._exit(), which skip the exit hook (docs/reliability.md). Thread-safe;
 * OK even when nothing is configured; IO if a file could not be written
 * (logged). */
FRAGCTL_API fragctl_status fragctl_flush(void);

/* --- Process-default allocators ------------------------------------------- */
/* One allocator per device, created on first use and alive until the process
 * exits (never destroyed, so late frees during exit stay valid). The
 * LD_PRELOAD library and the PyTorch entry points use them. They are built
 * from the environment, as fragctl_create_from_environment, unless
 * fragctl_configure_defaults ran first. */

/** Sets how process-default allocators are built: the environment's
 * configuration with `policy` (if not NULL), `options` applied on top of
 * FRAGCTL_CONF (if not NULL) and `backend` (if not NULL). Validates
 * everything at once (INVALID_ARGUMENT). STATE if a default allocator exists
 * already: configure before the first allocation. */
FRAGCTL_API fragctl_status fragctl_configure_defaults(const char* policy, const char* options,
                                                      const char* backend);

/** The process-default allocator of `device` (0..63). With create != 0 it is
 * built on first use (errors as fragctl_create; a failure is remembered and
 * returned again); with create == 0, *out is NULL when none exists yet. */
FRAGCTL_API fragctl_status fragctl_default_allocator(int device, int create, fragctl_allocator** out);

/** Writes a report document with every process-default allocator created so
 * far (one per device, in creation order; statistics and memory maps) to
 * `path`. */
FRAGCTL_API fragctl_status fragctl_write_default_report(const char* path);

/* --- PyTorch (torch.cuda.memory.CUDAPluggableAllocator) --------------------- */
/* docs/pytorch.md. Stream-ordered on the stream PyTorch passes (the
 * allocation stream, also at free), on the process-default allocator of
 * `device`. These two are the exception to "never throws": PyTorch does not
 * check for NULL, so a failed allocation throws fragctl::out_of_memory (a
 * std::bad_alloc) or another fragctl::error into PyTorch, which raises it in
 * Python with fragctl's message. Only C++ callers prepared for exceptions
 * (PyTorch) may call fragctl_torch_alloc. */

/** Allocates `size` bytes on `device` for `stream` (a cudaStream_t). */
FRAGCTL_API void* fragctl_torch_alloc(ssize_t size, int device, void* stream);

/** Frees `ptr` (of `size` bytes, from fragctl_torch_alloc on `device`)
 * stream-ordered on `stream`. Never throws; misuse is logged and counted (a
 * negative `size` is refused with an error line: the block stays live, to be
 * freed with its size). */
FRAGCTL_API void fragctl_torch_free(void* ptr, ssize_t size, int device, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FRAGCTL_FRAGCTL_H */
