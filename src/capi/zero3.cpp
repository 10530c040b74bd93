// C API of the ZeRO-3 block manager (fragctl/zero3/zero3.h): wrappers over
// zero3::block_manager that turn exceptions into fragctl_status, as the
// checkpoint store's (checkpoint.cpp) do.
//
// Layout, so that a new function is added the same way as the others: the
// handle (fragctl_zero3), then the helpers every wrapper uses (zero3_call,
// need, started), the communicators a spec or the caller's collectives make,
// then the C functions, each one zero3_call around one block_manager call.
#include "fragctl/zero3/zero3.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "capi/handle.hpp"
#include "fmt/format.h"
#include "fragctl/process_hooks.hpp"
#include "fragctl/stats_export.hpp"
#include "fragctl/zero3/block_manager.hpp"
#include "nlohmann/json.hpp"
#include "util/strings.hpp"

/// A manager, what it is built from, and the allocator handles it counts
/// itself a dependent of (once per role: twice when both are one handle).
struct fragctl_zero3 {
  fragctl_zero3(fragctl_allocator* l, fragctl_allocator* t) : long_lived(l), transient(t) {
    ++long_lived->dependents;
    ++transient->dependents;
  }
  ~fragctl_zero3() {
    manager.reset();
    comm.reset();
    --transient->dependents;
    --long_lived->dependents;
  }
  fragctl_zero3(const fragctl_zero3&) = delete;
  fragctl_zero3& operator=(const fragctl_zero3&) = delete;

  /// The manager's backend: the long-lived allocator's (the transient one is on the same device).
  [[nodiscard]] fragctl::device_backend& backend() const { return long_lived->stack->backend(); }

  fragctl_allocator* long_lived;
  fragctl_allocator* transient;
  fragctl::zero3::options opts;
  std::unique_ptr<fragctl::zero3::communicator> comm;
  std::vector<fragctl::zero3::block_spec> blocks;
  std::unique_ptr<fragctl::zero3::block_manager> manager;  ///< made by fragctl_zero3_start
};

namespace {

using namespace fragctl;
using namespace fragctl::zero3;
using fragctl::capi::fail;

/// Runs `body` (returning nothing) and turns any exception into a status:
/// the zero3 errors into BUDGET, COLLECTIVE and TIMEOUT, the rest as every
/// C API function does (capi::status_of_current_exception).
template <class Body>
fragctl_status zero3_call(Body&& body) noexcept {
  try {
    body();
    return FRAGCTL_OK;
  } catch (const collective_error& e) {
    return capi::fail(e.timed_out() ? FRAGCTL_ERROR_TIMEOUT : FRAGCTL_ERROR_COLLECTIVE, e.what());
  } catch (const budget_error& e) {
    return capi::fail(FRAGCTL_ERROR_BUDGET, e.what());
  } catch (...) {
    return capi::status_of_current_exception();
  }
}

void need(const void* p, const char* what) {
  if (p == nullptr) throw fragctl::invalid_argument(fmt::format("zero3: {} is NULL", what));
}

fragctl_zero3& started(fragctl_zero3* z) {
  need(z, "the manager");
  if (!z->manager) throw fragctl::invalid_argument("zero3: call fragctl_zero3_start first");
  // From a span callback of one of its allocators the call would wait for
  // that allocator's lock, which the call that maps holds.
  if (capi::inside_span_callback(z->long_lived) || capi::inside_span_callback(z->transient))
    throw fragctl::state_error("zero3: called from a span callback of the manager's allocator");
  return *z;
}

// --- communicators -------------------------------------------------------------

// "nccl:rank=0,size=2,id_file=/path,timeout_ms=1000,library=/path/libnccl.so.2"
std::unique_ptr<communicator> make_communicator(std::string_view spec, device_backend& backend) {
  const std::size_t colon = spec.find(':');
  const std::string kind = util::lower(util::trim(spec.substr(0, colon)));
  if (kind == "local" || kind.empty()) {
    if (backend.name() == "sim") return make_thread_communicator(make_thread_group(1, std::chrono::minutes(10)), 0, backend);
    nccl_options o;
    o.library = backend.name() == "hip" ? collective_library::rccl : collective_library::nccl;
    o.unique_id_env.clear();
    return make_nccl_communicator(backend, o);
  }
  if (kind != "nccl" && kind != "rccl") {
    throw fragctl::invalid_argument(fmt::format("zero3: communicator \"{}\": expected local, nccl:... or rccl:...", spec));
  }
  nccl_options o;
  o.library = kind == "rccl" ? collective_library::rccl : collective_library::nccl;
  const std::string_view rest = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  for (const std::string_view item : util::split(rest, ',')) {
    if (util::trim(item).empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string_view key = util::trim(item.substr(0, eq));
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : util::trim(item.substr(eq + 1));
    std::int64_t n = 0;
    const bool number = util::parse_i64(value, n);
    if (key == "rank" && number) o.rank = static_cast<int>(n);
    else if (key == "size" && number) o.size = static_cast<int>(n);
    else if (key == "timeout_ms" && number) o.timeout = std::chrono::milliseconds(n);
    else if (key == "id_file") o.unique_id_file = std::string(value);
    else if (key == "library") o.library_path = std::string(value);
    else throw fragctl::invalid_argument(fmt::format("zero3: communicator option \"{}\" not understood (rank, size, "
                                                     "id_file, timeout_ms, library)", item));
  }
  return make_nccl_communicator(backend, o);
}

// The caller's collectives (fragctl_zero3_collectives) as a communicator.
std::unique_ptr<communicator> make_communicator(const fragctl_zero3_collectives& c) {
  if (c.all_gather == nullptr || c.reduce_scatter == nullptr) {
    throw fragctl::invalid_argument("zero3: the collectives need both all_gather and reduce_scatter");
  }
  const auto result = [](int status) {
    return status == FRAGCTL_OK              ? callback_result::ok
           : status == FRAGCTL_ERROR_TIMEOUT ? callback_result::timed_out
                                             : callback_result::failed;
  };
  callback_collectives cc;
  cc.rank = c.rank;
  cc.size = c.size;
  cc.timeout = std::chrono::milliseconds(c.timeout_ms);
  cc.all_gather = [c, result](std::span<const gather_part> parts, stream_t stream, std::string_view tag,
                              std::string&) {
    std::vector<fragctl_zero3_gather_part> out;
    for (const gather_part& p : parts) out.push_back({p.send, p.recv, p.bytes});
    return result(c.all_gather(c.context, out.data(), out.size(), stream, std::string(tag).c_str()));
  };
  cc.reduce_scatter = [c, result](std::span<const scatter_part> parts, data_type type, stream_t stream,
                                  std::string_view tag, std::string&) {
    std::vector<fragctl_zero3_scatter_part> out;
    for (const scatter_part& p : parts) out.push_back({p.send, p.recv, p.elements});
    return result(c.reduce_scatter(c.context, out.data(), out.size(), static_cast<int>(type), stream,
                                   std::string(tag).c_str()));
  };
  return make_callback_communicator(std::move(cc));
}

std::size_t copy_views(std::span<const view> views, void** pointers, std::size_t* sizes, std::size_t capacity) {
  const std::size_t n = std::min(capacity, views.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (pointers != nullptr) pointers[i] = views[i].data;
    if (sizes != nullptr) sizes[i] = views[i].bytes;
  }
  return n;
}

static_assert(FRAGCTL_ZERO3_UINT8 == static_cast<int>(data_type::uint8) &&
              FRAGCTL_ZERO3_FLOAT16 == static_cast<int>(data_type::float16) &&
              FRAGCTL_ZERO3_BFLOAT16 == static_cast<int>(data_type::bfloat16) &&
              FRAGCTL_ZERO3_FLOAT32 == static_cast<int>(data_type::float32));

/// A manager without its communicator, on two allocator handles of one
/// backend and device, `options_text` parsed.
std::unique_ptr<fragctl_zero3> make_unstarted(fragctl_allocator* long_lived, fragctl_allocator* transient,
                                              const char* options_text) {
  need(long_lived, "the long-lived allocator");
  need(transient, "the transient allocator");
  const device_backend& l = long_lived->stack->backend();
  const device_backend& t = transient->stack->backend();
  if (l.name() != t.name() || l.device() != t.device()) {
    throw fragctl::invalid_argument(fmt::format(
        "zero3: the transient allocator is on {} device {}, the long-lived one on {} device {}: the manager's "
        "memory is on one device",
        t.name(), t.device(), l.name(), l.device()));
  }
  auto opts = parse_options(options_text != nullptr ? options_text : "");
  if (!opts.ok()) throw fragctl::invalid_argument(std::string(opts.status().message()));
  auto z = std::make_unique<fragctl_zero3>(long_lived, transient);
  z->opts = *opts;
  return z;
}

}  // namespace

extern "C" {

fragctl_status fragctl_zero3_create(fragctl_allocator* long_lived, fragctl_allocator* transient,
                                    const char* options_text, const char* communicator_spec, fragctl_zero3** out) {
  FRAGCTL_REQUIRE(out != nullptr, "fragctl_zero3_create: out is NULL");
  *out = nullptr;
  return zero3_call([&] {
    auto z = make_unstarted(long_lived, transient, options_text);
    z->comm = make_communicator(communicator_spec != nullptr ? communicator_spec : "local", z->backend());
    *out = z.release();
  });
}

fragctl_status fragctl_zero3_create_with_collectives(fragctl_allocator* long_lived, fragctl_allocator* transient,
                                                     const char* options_text, const fragctl_zero3_collectives* c,
                                                     fragctl_zero3** out) {
  FRAGCTL_REQUIRE(out != nullptr, "fragctl_zero3_create_with_collectives: out is NULL");
  *out = nullptr;
  return zero3_call([&] {
    need(c, "the collectives");
    auto z = make_unstarted(long_lived, transient, options_text);
    z->comm = make_communicator(*c);
    *out = z.release();
  });
}

fragctl_status fragctl_zero3_add_block(fragctl_zero3* z, const char* name, const fragctl_zero3_param* params,
                                       size_t count) {
  return zero3_call([&] {
    need(z, "the manager");
    need(name, "the block name");
    if (count > 0) need(params, "params");
    if (z->manager) throw fragctl::invalid_argument("zero3: blocks are added before fragctl_zero3_start");
    block_spec b{name, {}};
    for (std::size_t i = 0; i < count; ++i) {
      b.parameters.push_back({params[i].name != nullptr ? params[i].name : fmt::format("param{}", i),
                              params[i].elements, params[i].element_bytes, params[i].trainable != 0});
    }
    z->blocks.push_back(std::move(b));
  });
}

fragctl_status fragctl_zero3_start(fragctl_zero3* z) {
  return zero3_call([&] {
    need(z, "the manager");
    if (z->manager) throw fragctl::invalid_argument("zero3: started already");
    z->manager = std::make_unique<block_manager>(z->blocks, z->opts, *z->comm, z->long_lived->stack->allocator(),
                                                 z->transient->stack->allocator());
  });
}

fragctl_status fragctl_zero3_fetch(fragctl_zero3* z, size_t block, void* stream, void** pointers, size_t* sizes,
                                   size_t capacity) {
  return zero3_call([&] { copy_views(started(z).manager->fetch(block, stream), pointers, sizes, capacity); });
}

fragctl_status fragctl_zero3_release(fragctl_zero3* z, size_t block, void* stream) {
  return zero3_call([&] { started(z).manager->release(block, stream); });
}

fragctl_status fragctl_zero3_shard_of(fragctl_zero3* z, size_t block, size_t param, size_t* parameter_offset,
                                      void** pointer, size_t* bytes) {
  return zero3_call([&] {
    const block_manager::parameter_part p = started(z).manager->shard_of(block, param);
    if (parameter_offset != nullptr) *parameter_offset = p.parameter_offset;
    if (pointer != nullptr) *pointer = p.data.data;
    if (bytes != nullptr) *bytes = p.data.bytes;
  });
}

fragctl_status fragctl_zero3_trainable_shard(fragctl_zero3* z, size_t block, void** data, void** gradient,
                                             size_t* elements) {
  return zero3_call([&] {
    block_manager& m = *started(z).manager;
    const view grad = m.gradient_shard(block);  // checks `block`
    const block_layout& l = m.layout().blocks[block];
    const std::size_t n = l.trainable_shard_elements();
    if (data != nullptr) *data = n == 0 ? nullptr : static_cast<unsigned char*>(m.shard_buffer().data) + l.shard_offset;
    if (gradient != nullptr) *gradient = n == 0 ? nullptr : grad.data;
    if (elements != nullptr) *elements = n;
  });
}

fragctl_status fragctl_zero3_persistent(fragctl_zero3* z, size_t block, size_t param, void** data, void** gradient) {
  return zero3_call([&] {
    block_manager& m = *started(z).manager;
    if (block >= m.block_count()) throw fragctl::invalid_argument(fmt::format("zero3: no block {}", block));
    const block_layout& l = m.layout().blocks[block];
    if (param >= l.parameters.size()) {
      throw fragctl::invalid_argument(fmt::format("zero3: block '{}' has no parameter {}", l.name, param));
    }
    const parameter_layout& p = l.parameters[param];
    if (data != nullptr) *data = p.persistent ? m.persistent_parameter(block, param).data : nullptr;
    if (gradient != nullptr) {
      *gradient = p.persistent && p.trainable ? m.persistent_gradient(block, param).data : nullptr;
    }
  });
}

fragctl_status fragctl_zero3_begin_gradients(fragctl_zero3* z, size_t block, void* stream, void** pointers,
                                             size_t* sizes, size_t capacity) {
  return zero3_call([&] { copy_views(started(z).manager->begin_gradients(block, stream), pointers, sizes, capacity); });
}

fragctl_status fragctl_zero3_reduce_gradients(fragctl_zero3* z, size_t block, void* stream) {
  return zero3_call([&] { started(z).manager->reduce_gradients(block, stream); });
}

fragctl_status fragctl_zero3_finish_gradients(fragctl_zero3* z, void* stream) {
  return zero3_call([&] { started(z).manager->finish_gradients(stream); });
}

fragctl_status fragctl_zero3_release_gradients(fragctl_zero3* z, void* stream) {
  return zero3_call([&] { started(z).manager->release_gradients(stream); });
}

fragctl_status fragctl_zero3_end_step(fragctl_zero3* z, void* stream) {
  return zero3_call([&] { started(z).manager->end_step(stream); });
}

fragctl_status fragctl_zero3_synchronize(fragctl_zero3* z) {
  return zero3_call([&] { started(z).manager->synchronize(); });
}

// --- The gradient path of a framework binding (fragctl/zero3/gradient_flow.hpp) ---

fragctl_status fragctl_zero3_gradient_event(fragctl_zero3* z, int event, size_t block, size_t param, void* stream,
                                            const unsigned char* gradients_set, size_t shards,
                                            fragctl_zero3_gradient_action* actions, size_t capacity, size_t* count,
                                            int* more) {
  return zero3_call([&] {
    need(actions, "actions");
    need(count, "count");
    need(more, "more");
    *count = 0;
    *more = 0;
    if (event < FRAGCTL_ZERO3_APPLIED || event > FRAGCTL_ZERO3_RESUME) {
      throw fragctl::invalid_argument(fmt::format("zero3: unknown gradient event {}", event));
    }
    if (gradients_set == nullptr && shards > 0) need(gradients_set, "gradients_set");
    const gradient_batch batch = started(z).manager->gradient_step(
        static_cast<gradient_event>(event), block, param, stream,
        std::span<const unsigned char>(gradients_set, gradients_set == nullptr ? 0 : shards), capacity);
    for (const gradient_action& a : batch.actions) {
      actions[(*count)++] = {static_cast<int>(a.what), a.block, a.param, a.shard, a.slot, a.pointer, a.elements};
    }
    *more = batch.more ? 1 : 0;
  });
}

// --- end of the gradient path ------------------------------------------------------

fragctl_status fragctl_zero3_stats_json(fragctl_zero3* z, char** json) {
  FRAGCTL_REQUIRE(json != nullptr, "fragctl_zero3_stats_json: json is NULL");
  *json = nullptr;
  return zero3_call([&] { *json = capi::copy_out(to_json(started(z).manager->stats())); });
}

fragctl_status fragctl_zero3_record_hang(fragctl_zero3* z, const char* record) {
  FRAGCTL_REQUIRE(z != nullptr && record != nullptr, "fragctl_zero3_record_hang: manager or record is NULL");
  return zero3_call([&] {
    if (const absl::Status s = record_stats_export_hang(record); !s.ok()) {
      throw fragctl::invalid_argument(fmt::format("fragctl_zero3_record_hang: {}", util::to_std(s.message())));
    }
    const std::uint64_t failures_before = output_failures();
    (void)flush_process_outputs("hang");
    if (output_failures() != failures_before)
      throw fragctl::error("zero3: a report with the hang could not be written");
  });
}

fragctl_status fragctl_zero3_default_options_json(char** json) {
  FRAGCTL_REQUIRE(json != nullptr, "fragctl_zero3_default_options_json: json is NULL");
  *json = nullptr;
  return zero3_call([&] {
    const options defaults;
    const nlohmann::json j = {{"stage3_max_live_parameters", deepspeed_max_live_parameters},
                              {"stage3_prefetch_bucket_size", deepspeed_prefetch_bucket_size},
                              {"stage3_param_persistence_threshold", deepspeed_param_persistence_threshold},
                              {"reduce_bucket_size", deepspeed_reduce_bucket_size},
                              {"alignment", defaults.alignment}};
    *json = capi::copy_out(j.dump());
  });
}

void fragctl_zero3_destroy(fragctl_zero3* z) { delete z; }

}  // extern "C"
