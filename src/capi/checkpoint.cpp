// C API of the activation-checkpoint store (fragctl/checkpoint/checkpoint.h):
// wrappers over checkpoint::store that turn exceptions into status codes.
#include "fragctl/checkpoint/checkpoint.h"

#include <memory>
#include <string>

#include "capi/handle.hpp"
#include "fragctl/checkpoint/store.hpp"

/// A store and the allocator handle it counts itself a dependent of.
struct fragctl_checkpoint_store {
  fragctl_checkpoint_store(fragctl_allocator* a, std::unique_ptr<fragctl::checkpoint::store> s)
      : allocator(a), store(std::move(s)), backend(a->stack->backend().name()) {
    ++allocator->dependents;
  }
  ~fragctl_checkpoint_store() {
    store.reset();
    --allocator->dependents;
  }
  fragctl_checkpoint_store(const fragctl_checkpoint_store&) = delete;
  fragctl_checkpoint_store& operator=(const fragctl_checkpoint_store&) = delete;

  fragctl_allocator* allocator;
  std::unique_ptr<fragctl::checkpoint::store> store;
  std::string backend;
};

namespace {

using fragctl::capi::fail;
using fragctl::capi::guarded;

static_assert(FRAGCTL_CHECKPOINT_ABSENT == static_cast<int>(fragctl::checkpoint::residence::absent) &&
              FRAGCTL_CHECKPOINT_DEVICE == static_cast<int>(fragctl::checkpoint::residence::device) &&
              FRAGCTL_CHECKPOINT_HOST == static_cast<int>(fragctl::checkpoint::residence::host));

}  // namespace

extern "C" {

size_t fragctl_checkpoint_alignment(void) { return fragctl::checkpoint::store_alignment; }

fragctl_status fragctl_checkpoint_create(fragctl_allocator* allocator, size_t device_budget, size_t prefetch_depth,
                                         int evict_ahead, fragctl_checkpoint_store** out) {
  FRAGCTL_REQUIRE(allocator != nullptr && out != nullptr,
                             "fragctl_checkpoint_create: allocator or out is NULL");
  *out = nullptr;
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_checkpoint_create");
  return guarded([&] {
    fragctl::checkpoint::store_options o;
    o.device_budget = device_budget;
    o.prefetch_depth = prefetch_depth;
    o.evict_ahead = evict_ahead != 0;
    *out = new fragctl_checkpoint_store(
        allocator, std::make_unique<fragctl::checkpoint::store>(allocator->stack->allocator(), std::move(o)));
    return FRAGCTL_OK;
  });
}

void fragctl_checkpoint_destroy(fragctl_checkpoint_store* store) { delete store; }

fragctl_status fragctl_checkpoint_put(fragctl_checkpoint_store* store, int layer, size_t bytes, void* stream,
                                      void** ptr) {
  FRAGCTL_REQUIRE(store != nullptr && ptr != nullptr, "fragctl_checkpoint_put: store or ptr is NULL");
  *ptr = nullptr;
  FRAGCTL_NOT_IN_SPAN_CALLBACK(store->allocator, "fragctl_checkpoint_put");
  return guarded([&] {
    *ptr = store->store->put(layer, bytes, stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_checkpoint_get(fragctl_checkpoint_store* store, int layer, void* stream, void** ptr) {
  FRAGCTL_REQUIRE(store != nullptr && ptr != nullptr, "fragctl_checkpoint_get: store or ptr is NULL");
  *ptr = nullptr;
  FRAGCTL_NOT_IN_SPAN_CALLBACK(store->allocator, "fragctl_checkpoint_get");
  return guarded([&] {
    *ptr = store->store->get(layer, stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_checkpoint_drop(fragctl_checkpoint_store* store, int layer) {
  FRAGCTL_REQUIRE(store != nullptr, "fragctl_checkpoint_drop: store is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(store->allocator, "fragctl_checkpoint_drop");
  store->store->drop(layer);
  return FRAGCTL_OK;
}

fragctl_status fragctl_checkpoint_reset(fragctl_checkpoint_store* store) {
  FRAGCTL_REQUIRE(store != nullptr, "fragctl_checkpoint_reset: store is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(store->allocator, "fragctl_checkpoint_reset");
  return guarded([&] {
    store->store->reset();
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_checkpoint_stream_ending(fragctl_checkpoint_store* store, void* stream) {
  FRAGCTL_REQUIRE(store != nullptr, "fragctl_checkpoint_stream_ending: store is NULL");
  return guarded([&] {
    store->store->stream_ending(stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_checkpoint_synchronize(fragctl_checkpoint_store* store) {
  FRAGCTL_REQUIRE(store != nullptr, "fragctl_checkpoint_synchronize: store is NULL");
  return guarded([&] {
    store->store->synchronize();
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_checkpoint_where(fragctl_checkpoint_store* store, int layer, int* where) {
  FRAGCTL_REQUIRE(store != nullptr && where != nullptr, "fragctl_checkpoint_where: store or where is NULL");
  return guarded([&] {
    *where = static_cast<int>(store->store->where(layer));
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_checkpoint_copy_stream(fragctl_checkpoint_store* store, void** stream) {
  FRAGCTL_REQUIRE(store != nullptr && stream != nullptr,
                             "fragctl_checkpoint_copy_stream: store or stream is NULL");
  *stream = store->store->copy_stream();
  return FRAGCTL_OK;
}

const char* fragctl_checkpoint_backend(const fragctl_checkpoint_store* store) {
  return store == nullptr ? "" : store->backend.c_str();
}

fragctl_status fragctl_checkpoint_stats_json(fragctl_checkpoint_store* store, char** json) {
  FRAGCTL_REQUIRE(store != nullptr && json != nullptr,
                             "fragctl_checkpoint_stats_json: store or json is NULL");
  *json = nullptr;
  return guarded([&] {
    *json = fragctl::capi::copy_out(fragctl::checkpoint::to_json(store->store->stats()));
    return FRAGCTL_OK;
  });
}

}  // extern "C"
