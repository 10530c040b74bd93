// store_stats as JSON (the fields are listed in docs/checkpoint.md).
#include "nlohmann/json.hpp"
#include "fragctl/checkpoint/store.hpp"

namespace fragctl::checkpoint {

std::string to_json(const store_stats& s) {
  using nlohmann::json;
  const auto gauge = [](const byte_gauge& g) { return json{{"current", g.current}, {"peak", g.peak}}; };
  json j{
      {"device_budget", s.device_budget},
      {"device_bytes", gauge(s.device)},
      {"host_bytes", gauge(s.host)},
      {"host_arena",
       {{"provider", s.host_provider},
        {"live_bytes", s.host_arena.live_bytes},
        {"peak_live_bytes", s.host_arena.peak_live_bytes},
        {"pinned_bytes", s.host_arena.pinned_bytes},
        {"pin_calls", s.host_arena.pin_calls},
        {"allocations", s.host_arena.allocations},
        {"frees", s.host_arena.frees}}},
      {"iterations", s.iterations},
      {"puts", s.puts},
      {"gets", s.gets},
      {"drops", s.drops},
      {"copies",
       {{"evictions", s.evictions},
        {"evictions_ahead", s.evictions_ahead},
        {"evictions_without_copy", s.evictions_without_copy},
        {"prefetches", s.prefetches},
        {"fetches_on_demand", s.fetches_on_demand},
        {"bytes_to_host", s.bytes_to_host},
        {"bytes_to_device", s.bytes_to_device},
        {"to_host_seconds", s.to_host_seconds},
        {"to_device_seconds", s.to_device_seconds},
        {"to_host_bytes_per_second", s.to_host_bandwidth()},
        {"to_device_bytes_per_second", s.to_device_bandwidth()}}},
      {"gets_by_source",
       {{"resident", s.gets_resident},
        {"prefetched", s.gets_prefetched},
        {"on_demand", s.gets_on_demand},
        {"prefetch_pending", s.gets_prefetch_pending}}},
      {"stream_waits", s.stream_waits},
      {"wait_seconds", s.wait_seconds},
  };
  return j.dump(2);
}

}  // namespace fragctl::checkpoint
