// C API of the block manager: each function catches every exception and
// turns it into a status plus a thread-local message.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/zero3/block_manager.hpp"
#include "fragctl/zero3/zero3.h"
#include "util/error_class.hpp"
#include "util/strings.hpp"
#include "zero3/shared_allocator.hpp"

struct fragctl_zero3 {
  fragctl::config cfg;
  fragctl::zero3::options opts;
  std::unique_ptr<fragctl::device_backend> backend;
  std::unique_ptr<fragctl::device_allocator> persistent;  // null once an allocator is given
  std::unique_ptr<fragctl::device_allocator> transient;
  // The allocator given by fragctl_zero3_use_allocator (not owned), and how
  // to tell its owner the manager is done with it.
  fragctl::device_allocator* shared = nullptr;
  fragctl::zero3::allocator_release release_shared = nullptr;
  void* release_context = nullptr;
  std::unique_ptr<fragctl::zero3::communicator> comm;
  std::vector<fragctl::zero3::block_spec> blocks;
  std::unique_ptr<fragctl::zero3::block_manager> manager;
  std::string json;
};

namespace {

using namespace fragctl;
using namespace fragctl::zero3;

thread_local std::string last_error;

template <class F>
fragctl_zero3_status guarded(F&& body) noexcept {
  try {
    last_error.clear();
    body();
    return FRAGCTL_ZERO3_OK;
  } catch (const collective_error& e) {
    last_error = e.what();
    return e.timed_out() ? FRAGCTL_ZERO3_TIMEOUT : FRAGCTL_ZERO3_COLLECTIVE;
  } catch (const budget_error& e) {
    last_error = e.what();
    return FRAGCTL_ZERO3_BUDGET;
  } catch (...) {
    const util::caught_error e = util::classify_current_exception();
    last_error = e.kind == util::error_class::unknown ? std::string_view("unknown error") : e.message;
    switch (e.kind) {
      case util::error_class::out_of_memory: return FRAGCTL_ZERO3_OUT_OF_MEMORY;
      case util::error_class::invalid_argument: return FRAGCTL_ZERO3_INVALID_ARGUMENT;
      case util::error_class::backend: return FRAGCTL_ZERO3_BACKEND;
      case util::error_class::other_fragctl:
      case util::error_class::internal:
      case util::error_class::unknown: break;
    }
    return FRAGCTL_ZERO3_ERROR;
  }
}

void need(const void* p, const char* what) {
  if (p == nullptr) throw fragctl::invalid_argument(fmt::format("zero3: {} is NULL", what));
}

fragctl_zero3& started(fragctl_zero3* z) {
  need(z, "the manager");
  if (!z->manager) throw fragctl::invalid_argument("zero3: call fragctl_zero3_start first");
  return *z;
}

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
    return status == FRAGCTL_ZERO3_OK        ? callback_result::ok
           : status == FRAGCTL_ZERO3_TIMEOUT ? callback_result::timed_out
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

/// A manager without its communicator: the configuration read from the
/// environment (FRAGCTL_POLICY, FRAGCTL_CONF, FRAGCTL_BACKEND), `options_text`
/// parsed, the backend and the two allocators (persistent, transient) made.
std::unique_ptr<fragctl_zero3> make_unstarted(const char* options_text) {
  auto z = std::make_unique<fragctl_zero3>();
  auto cfg = config_from_environment();
  if (!cfg.ok()) throw fragctl::invalid_argument(std::string(cfg.status().message()));
  z->cfg = *cfg;
  auto opts = parse_options(options_text != nullptr ? options_text : "");
  if (!opts.ok()) throw fragctl::invalid_argument(std::string(opts.status().message()));
  z->opts = *opts;
  z->backend = make_backend(z->cfg);
  z->persistent = make_policy(z->cfg.policy, z->cfg, *z->backend);
  z->transient = make_policy(z->cfg.policy, z->cfg, *z->backend);
  return z;
}

}  // namespace

extern "C" {

fragctl_zero3_status fragctl_zero3_create(const char* options_text, const char* communicator_spec,
                                          fragctl_zero3** out) {
  return guarded([&] {
    need(out, "out");
    *out = nullptr;
    auto z = make_unstarted(options_text);
    z->comm = make_communicator(communicator_spec != nullptr ? communicator_spec : "local", *z->backend);
    *out = z.release();
  });
}

fragctl_zero3_status fragctl_zero3_create_with_collectives(const char* options_text, const fragctl_zero3_collectives* c,
                                                           fragctl_zero3** out) {
  return guarded([&] {
    need(out, "out");
    *out = nullptr;
    need(c, "the collectives");
    auto z = make_unstarted(options_text);
    z->comm = make_communicator(*c);
    *out = z.release();
  });
}

fragctl_zero3_status fragctl_zero3_add_block(fragctl_zero3* z, const char* name, const fragctl_zero3_param* params,
                                             size_t count) {
  return guarded([&] {
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

fragctl_zero3_status fragctl_zero3_start(fragctl_zero3* z) {
  return guarded([&] {
    need(z, "the manager");
    if (z->manager) throw fragctl::invalid_argument("zero3: started already");
    device_allocator& persistent = z->shared != nullptr ? *z->shared : *z->persistent;
    device_allocator& transient = z->shared != nullptr ? *z->shared : *z->transient;
    z->manager = std::make_unique<block_manager>(z->blocks, z->opts, *z->comm, persistent, transient);
  });
}

fragctl_zero3_status fragctl_zero3_fetch(fragctl_zero3* z, size_t block, void* stream, void** pointers, size_t* sizes,
                                         size_t capacity) {
  return guarded([&] { copy_views(started(z).manager->fetch(block, stream), pointers, sizes, capacity); });
}

fragctl_zero3_status fragctl_zero3_release(fragctl_zero3* z, size_t block, void* stream) {
  return guarded([&] { started(z).manager->release(block, stream); });
}

fragctl_zero3_status fragctl_zero3_shard_of(fragctl_zero3* z, size_t block, size_t param, size_t* parameter_offset,
                                            void** pointer, size_t* bytes) {
  return guarded([&] {
    const block_manager::parameter_part p = started(z).manager->shard_of(block, param);
    if (parameter_offset != nullptr) *parameter_offset = p.parameter_offset;
    if (pointer != nullptr) *pointer = p.data.data;
    if (bytes != nullptr) *bytes = p.data.bytes;
  });
}

fragctl_zero3_status fragctl_zero3_trainable_shard(fragctl_zero3* z, size_t block, void** data, void** gradient,
                                                   size_t* elements) {
  return guarded([&] {
    block_manager& m = *started(z).manager;
    const view grad = m.gradient_shard(block);  // checks `block`
    const block_layout& l = m.layout().blocks[block];
    const std::size_t n = l.trainable_shard_elements();
    if (data != nullptr) *data = n == 0 ? nullptr : static_cast<unsigned char*>(m.shard_buffer().data) + l.shard_offset;
    if (gradient != nullptr) *gradient = n == 0 ? nullptr : grad.data;
    if (elements != nullptr) *elements = n;
  });
}

fragctl_zero3_status fragctl_zero3_persistent(fragctl_zero3* z, size_t block, size_t param, void** data,
                                              void** gradient) {
  return guarded([&] {
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

fragctl_zero3_status fragctl_zero3_begin_gradients(fragctl_zero3* z, size_t block, void* stream, void** pointers,
                                                   size_t* sizes, size_t capacity) {
  return guarded([&] { copy_views(started(z).manager->begin_gradients(block, stream), pointers, sizes, capacity); });
}

fragctl_zero3_status fragctl_zero3_reduce_gradients(fragctl_zero3* z, size_t block, void* stream) {
  return guarded([&] { started(z).manager->reduce_gradients(block, stream); });
}

fragctl_zero3_status fragctl_zero3_finish_gradients(fragctl_zero3* z, void* stream) {
  return guarded([&] { started(z).manager->finish_gradients(stream); });
}

fragctl_zero3_status fragctl_zero3_release_gradients(fragctl_zero3* z, void* stream) {
  return guarded([&] { started(z).manager->release_gradients(stream); });
}

fragctl_zero3_status fragctl_zero3_end_step(fragctl_zero3* z, void* stream) {
  return guarded([&] { started(z).manager->end_step(stream); });
}

fragctl_zero3_status fragctl_zero3_synchronize(fragctl_zero3* z) {
  return guarded([&] { started(z).manager->synchronize(); });
}

// --- the gradient path of a framework binding ------------------------------------

static_assert(FRAGCTL_ZERO3_APPLIED == static_cast<int>(gradient_event::applied) &&
              FRAGCTL_ZERO3_ARRIVED == static_cast<int>(gradient_event::arrived) &&
              FRAGCTL_ZERO3_RESUME == static_cast<int>(gradient_event::resume) &&
              FRAGCTL_ZERO3_DO_TRACK == static_cast<int>(gradient_do::track) &&
              FRAGCTL_ZERO3_DO_BUCKET_COPY == static_cast<int>(gradient_do::bucket_copy) &&
              FRAGCTL_ZERO3_DO_RELEASE == static_cast<int>(gradient_do::release) &&
              FRAGCTL_ZERO3_DO_SET_GRAD == static_cast<int>(gradient_do::set_grad));

fragctl_zero3_status fragctl_zero3_gradient_event(fragctl_zero3* z, int event, size_t block, size_t param,
                                                  void* stream, const unsigned char* gradients_set, size_t shards,
                                                  fragctl_zero3_gradient_action* actions, size_t capacity,
                                                  size_t* count, int* more) {
  return guarded([&] {
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

size_t fragctl_zero3_stats_json(fragctl_zero3* z, char* buffer, size_t capacity) {
  std::size_t length = 0;
  const fragctl_zero3_status s = guarded([&] {
    z->json = to_json(started(z).manager->stats());
    length = z->json.size();
    if (buffer != nullptr && capacity > 0) {
      const std::size_t n = std::min(capacity - 1, length);
      std::memcpy(buffer, z->json.data(), n);
      buffer[n] = '\0';
    }
  });
  return s == FRAGCTL_ZERO3_OK ? length : 0;
}

const char* fragctl_zero3_last_error(void) { return last_error.c_str(); }

const char* fragctl_zero3_status_string(fragctl_zero3_status status) {
  switch (status) {
    case FRAGCTL_ZERO3_OK: return "FRAGCTL_ZERO3_OK";
    case FRAGCTL_ZERO3_INVALID_ARGUMENT: return "FRAGCTL_ZERO3_INVALID_ARGUMENT";
    case FRAGCTL_ZERO3_OUT_OF_MEMORY: return "FRAGCTL_ZERO3_OUT_OF_MEMORY";
    case FRAGCTL_ZERO3_BUDGET: return "FRAGCTL_ZERO3_BUDGET";
    case FRAGCTL_ZERO3_COLLECTIVE: return "FRAGCTL_ZERO3_COLLECTIVE";
    case FRAGCTL_ZERO3_TIMEOUT: return "FRAGCTL_ZERO3_TIMEOUT";
    case FRAGCTL_ZERO3_BACKEND: return "FRAGCTL_ZERO3_BACKEND";
    case FRAGCTL_ZERO3_ERROR: return "FRAGCTL_ZERO3_ERROR";
  }
  return "FRAGCTL_ZERO3_UNKNOWN";
}

void fragctl_zero3_destroy(fragctl_zero3* z) {
  if (z == nullptr) return;
  (void)guarded([&] {
    z->manager.reset();
    z->comm.reset();
    z->transient.reset();
    z->persistent.reset();
    if (z->release_shared != nullptr) z->release_shared(z->release_context);
    z->backend.reset();
    delete z;
  });
}

}  // extern "C"

namespace fragctl::zero3 {

fragctl_zero3_status use_allocator(fragctl_zero3* z, device_allocator* allocator, allocator_release release,
                                   void* context) noexcept {
  return guarded([&] {
    need(z, "the manager");
    need(allocator, "the allocator");
    if (z->manager) throw fragctl::invalid_argument("zero3: an allocator is given before fragctl_zero3_start");
    const device_backend& theirs = allocator->backend();
    if (theirs.name() != z->backend->name() || theirs.device() != z->backend->device()) {
      throw fragctl::invalid_argument(fmt::format(
          "zero3: the allocator is on {} device {}, the manager on {} device {} (FRAGCTL_BACKEND, the device)",
          theirs.name(), theirs.device(), z->backend->name(), z->backend->device()));
    }
    if (z->release_shared != nullptr) z->release_shared(z->release_context);
    z->shared = allocator;
    z->release_shared = release;
    z->release_context = context;
    z->transient.reset();
    z->persistent.reset();
  });
}

}  // namespace fragctl::zero3
