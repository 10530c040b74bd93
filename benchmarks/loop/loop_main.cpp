// bench_loop: what one malloc or free costs on average through the stack,
// without a clock read per operation (docs/benchmarks-guide.md, "The fast
// path in a tight loop").
//
//   bench_loop --traces=a.trace.csv.gz,b.trace.csv.gz [--policy=arena] [--backend=sim]
//              [--conf=...] [--rounds=20] [--depth=stack,policy]
//
// `fragctl replay` times every operation alone, each sample with one clock
// read in it (20 to 50 ns on the machines in docs/benchmarks.md, and
// counted in steps of 10 ns on some), so its median carries the clock. Here
// each trace's operations are turned into slots once (the address a block
// was recorded at becomes an index), then replayed in a tight loop --rounds
// times, each round on a fresh allocator (a fresh job), and only the whole
// loop is timed: the figure is the mean per operation over the round, the
// rare slow operations (driver calls, the plan's search and layout)
// included, the clock not. One table row per trace, policy and depth:
//   stack   the allocator make_allocator gives a user (lock, statistics,
//           stream uses, limit, policy)
//   policy  the policy under every adaptor, called directly
// with the lowest and the median round's ns per operation. An allocation
// the backend cannot hold is counted (ooms), one of a size no device holds
// too (refused), and its free skipped. Unlike `fragctl replay`, which frees
// the older block, a second allocation at an address still live (a lost
// free) is dropped with its free: on a trace with lost frees the operations
// differ from replay's. Progress goes to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "bench_options.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"
#include "fragctl/trace.hpp"
#include "util/strings.hpp"

namespace fragctl::bench {

namespace {

struct loop_options {
  bench_options common;
  std::vector<std::string> traces;
  std::vector<std::string> depths;
  int rounds = 20;
};

loop_options parse(int argc, char** argv) {
  config base;
  base.backend = backend_kind::sim;
  auto common = parse_bench_options(argc, argv, {"traces", "rounds", "depth"}, {}, base);
  if (!common.ok()) throw std::invalid_argument(std::string(util::to_std(common.status().message())));
  loop_options o;
  o.common = *std::move(common);
  if (o.common.all_policies) o.common.policies = {"arena"};
  const std::string traces = extra_flag(o.common, "traces", "");
  for (const std::string_view t : util::split(traces, ',')) {
    if (!util::trim(t).empty()) o.traces.emplace_back(util::trim(t));
  }
  if (o.traces.empty()) throw std::invalid_argument("--traces: name one or more trace files, comma-separated");
  std::uint64_t rounds = 0;
  if (!util::parse_u64(extra_flag(o.common, "rounds", "20"), rounds) || rounds == 0 || rounds > 10000)
    throw std::invalid_argument("--rounds: expected a count from 1 to 10000");
  o.rounds = static_cast<int>(rounds);
  const std::string depths = extra_flag(o.common, "depth", "stack,policy");
  for (const std::string_view d : util::split(depths, ',')) {
    const std::string_view depth = util::trim(d);
    if (depth.empty()) continue;
    if (depth != "stack" && depth != "policy")
      throw std::invalid_argument(fmt::format("--depth: '{}' is neither stack nor policy", depth));
    o.depths.emplace_back(depth);
  }
  if (o.depths.empty()) throw std::invalid_argument("--depth: name stack, policy or both, comma-separated");
  return o;
}

// One operation of a trace: a block's slot (the index its address maps to
// while it is live), its size and stream.
struct operation {
  bool alloc;
  std::uint32_t slot;
  std::size_t size;
  std::uint64_t stream;
};

struct slotted_trace {
  std::vector<operation> ops;
  std::uint32_t slots = 0;
};

// A free of an address not live, and a second allocation at a live address
// (a lost free), are dropped: what the loop replays is well-formed.
slotted_trace slot(const trace& t) {
  slotted_trace s;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> live;
  std::vector<std::uint32_t> idle;
  for (const trace_event& e : t.events) {
    if (e.kind == trace_event::action::alloc) {
      if (live.contains(e.addr)) continue;
      std::uint32_t k = s.slots;
      if (idle.empty()) {
        ++s.slots;
      } else {
        k = idle.back();
        idle.pop_back();
      }
      live.emplace(e.addr, k);
      s.ops.push_back({true, k, e.size, e.stream});
    } else if (const auto it = live.find(e.addr); it != live.end()) {
      s.ops.push_back({false, it->second, e.size, e.stream});
      idle.push_back(it->second);
      live.erase(it);
    }
  }
  return s;
}

// The policy under every adaptor of the stack.
device_allocator& policy_of(device_allocator& top) {
  device_allocator* a = &top;
  while (auto* adaptor = dynamic_cast<forwarding_adaptor*>(a)) a = &adaptor->upstream();
  return *a;
}

struct round_result {
  double ns_per_op = 0;
  std::uint64_t ooms = 0;
  std::uint64_t refused = 0;  // sizes no device holds (invalid_argument), as replay counts them
};

round_result round_once(const slotted_trace& t, const config& cfg, bool whole_stack) {
  const std::unique_ptr<allocator_stack> stack = make_allocator(cfg);
  device_allocator& a = whole_stack ? stack->allocator() : policy_of(stack->allocator());
  absl::flat_hash_map<std::uint64_t, stream_t> streams;
  std::vector<stream_t> stream_of(t.ops.size(), nullptr);
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const std::uint64_t id = t.ops[i].stream;
    if (id == 0) continue;
    auto it = streams.find(id);
    if (it == streams.end()) it = streams.emplace(id, stack->create_stream()).first;
    stream_of[i] = it->second;
  }
  std::vector<void*> ptr(t.slots, nullptr);
  std::vector<std::size_t> size(t.slots, 0);
  round_result r;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const operation& o = t.ops[i];
    if (o.alloc) {
      try {
        ptr[o.slot] = a.allocate(o.size, stream_of[i]);
        size[o.slot] = o.size;
      } catch (const out_of_memory&) {
        ptr[o.slot] = nullptr;
        ++r.ooms;
      } catch (const invalid_argument&) {
        ptr[o.slot] = nullptr;
        ++r.refused;
      }
    } else if (ptr[o.slot] != nullptr) {
      a.deallocate(ptr[o.slot], size[o.slot], stream_of[i]);
      ptr[o.slot] = nullptr;
    }
  }
  const auto end = std::chrono::steady_clock::now();
  r.ns_per_op = std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(t.ops.size());
  for (std::uint32_t k = 0; k < t.slots; ++k) {
    if (ptr[k] != nullptr) a.deallocate(ptr[k], size[k], nullptr);
  }
  return r;
}

int run(const loop_options& o) {
  std::printf("| trace | policy | depth | operations | ns/op, lowest round | ns/op, median round | ooms | refused |\n");
  std::printf("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const std::string& path : o.traces) {
    absl::StatusOr<trace> t = read_trace(path);
    if (!t.ok()) throw std::invalid_argument(std::string(util::to_std(t.status().message())));
    const slotted_trace s = slot(*t);
    if (s.ops.empty()) throw std::invalid_argument(fmt::format("{}: no allocation to replay", path));
    for (const std::string& policy : o.common.policies) {
      config cfg = o.common.cfg;
      cfg.policy = policy;
      for (const std::string& depth : o.depths) {
        std::vector<double> ns;
        std::uint64_t ooms = 0, refused = 0;
        for (int r = 0; r < o.rounds; ++r) {
          std::fprintf(stderr, "\r%s %s %s: round %d of %d", t->name.c_str(), policy.c_str(), depth.c_str(), r + 1,
                       o.rounds);
          const round_result rr = round_once(s, cfg, depth == "stack");
          ns.push_back(rr.ns_per_op);
          ooms = std::max(ooms, rr.ooms);
          refused = std::max(refused, rr.refused);
        }
        std::fprintf(stderr, "\n");
        std::sort(ns.begin(), ns.end());
        std::printf("| %s | %s | %s | %zu | %.1f | %.1f | %llu | %llu |\n", t->name.c_str(), policy.c_str(),
                    depth.c_str(), s.ops.size(), ns.front(), ns[ns.size() / 2], static_cast<unsigned long long>(ooms),
                    static_cast<unsigned long long>(refused));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

}  // namespace fragctl::bench

int main(int argc, char** argv) {
  try {
    return fragctl::bench::run(fragctl::bench::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loop: %s\n", e.what());
    return 2;
  }
}
