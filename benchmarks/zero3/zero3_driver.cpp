// ZeRO-3 driver: a Llama-shaped parameter set through the block manager, one
// rank per GPU over NCCL (or threads over sim for a dry run), with checks and
// measurements for docs/zero3.md:
//  * byte-exact gathered blocks (every word against a deterministic pattern),
//  * reduce-scattered bf16 gradients equal to the exact sum over ranks,
//  * device memory from the driver (get_memory_info) against 16 Psi / N plus
//    the gather budget,
//  * all-gather bandwidth through the manager and through the bare
//    communicator, for comparison with torch.distributed in the same run.
//
//   bench_zero3 --rank R --size N --id-file PATH [--layers 24 --hidden 2048 ...] --out DIR
//   bench_zero3 --backend sim --size 2 --layers 2 --hidden 256 ...     (threads as ranks)
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "driver_support.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/zero3/block_manager.hpp"
#include "nlohmann/json.hpp"
#include "zero3/collectives/host_math.hpp"

namespace zero3_driver {
namespace {

using namespace fragctl;
using namespace fragctl::zero3;
using json = nlohmann::ordered_json;
using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

std::size_t used(device_backend& backend) {
  const memory_info m = backend.get_memory_info();
  return m.total - m.free;
}

// Writes pattern words (starting at pattern word `first`) into n host bytes.
void fill_words(void* host, std::size_t n, std::size_t first, unsigned threads,
                const std::function<std::uint64_t(std::size_t)>& word) {
  const std::size_t words = (n + 7) / 8;
  parallel_for(words, threads, [&](std::size_t begin, std::size_t end) {
    for (std::size_t k = begin; k < end; ++k) {
      const std::uint64_t w = word(first + k);
      std::memcpy(static_cast<unsigned char*>(host) + 8 * k, &w, std::min<std::size_t>(8, n - 8 * k));
    }
  });
}

std::size_t count_mismatches(const void* host, std::size_t n, std::size_t first, unsigned threads,
                             const std::function<std::uint64_t(std::size_t)>& word) {
  std::atomic<std::size_t> bad{0};
  parallel_for(n / 8, threads, [&](std::size_t begin, std::size_t end) {
    std::size_t local = 0;
    for (std::size_t k = begin; k < end; ++k) {
      std::uint64_t w = 0;
      std::memcpy(&w, static_cast<const unsigned char*>(host) + 8 * k, 8);
      if (w != word(first + k)) ++local;
    }
    bad += local;
  });
  return bad.load();
}

float gradient_expected(int ranks, std::size_t c, std::size_t i) {
  const auto n = static_cast<float>(ranks);
  return n * static_cast<float>((c + i) % 11) + n * (n - 1) / 2;
}

struct rank_run {
  const arguments& args;
  device_backend& backend;
  communicator& comm;
  json out;
  bool ok = true;
};

void run_rank(rank_run& run) {
  const arguments& args = run.args;
  device_backend& backend = run.backend;
  communicator& comm = run.comm;
  const int rank = comm.rank();
  const int ranks = comm.size();
  json& out = run.out;
  const auto threads = static_cast<unsigned>(args.number("host-threads", 8));

  model_shape shape;
  shape.layers = args.number("layers", shape.layers);
  shape.hidden = args.number("hidden", shape.hidden);
  shape.intermediate = args.number("intermediate", shape.intermediate);
  shape.vocab = args.number("vocab", shape.vocab);
  shape.heads = args.number("heads", shape.heads);
  shape.kv_heads = args.number("kv-heads", shape.kv_heads);
  const std::vector<block_spec> blocks = llama_blocks(shape);
  auto parsed = parse_options(args.text("options", ""));
  if (!parsed.ok()) throw invalid_argument(std::string(parsed.status().message()));
  const options opts = *parsed;

  // NCCL allocates its connection buffers at the first collectives: run one
  // of each kind first, so the baseline below includes them.
  {
    const std::size_t bytes = args.number("warmup-mib", 64) << 20;
    void* send = backend.allocate(bytes);
    void* recv = backend.allocate(bytes * static_cast<std::size_t>(ranks));
    if (send == nullptr || recv == nullptr) throw std::runtime_error("cannot allocate the warm-up buffers");
    const stream_t warm = backend.create_stream();
    const gather_part g{send, recv, bytes};
    comm.all_gather(std::span(&g, 1), warm, "warm-up");
    const scatter_part r{recv, send, bytes / 2};
    comm.reduce_scatter(std::span(&r, 1), data_type::bfloat16, warm, "warm-up");
    comm.synchronize();
    backend.synchronize_stream(warm);
    backend.destroy_stream(warm);
    backend.free(send, bytes);
    backend.free(recv, bytes * static_cast<std::size_t>(ranks));
  }
  json memory;
  memory["total"] = backend.get_memory_info().total;
  memory["used_after_comm"] = used(backend);
  config cfg;
  statistics_adaptor persistent(make_policy(args.text("persistent-policy", "arena"), cfg, backend));
  statistics_adaptor transient(make_policy(args.text("transient-policy", "arena"), cfg, backend));
  block_manager m(blocks, opts, comm, persistent, transient);
  const model_layout& layout = m.layout();
  // Mixed-precision Adam: fp32 master weights, momentum and variance of this
  // rank's trainable slice, and of the (replicated) persistent parameters.
  const std::size_t optimizer_elements = layout.trainable_shard_elements + layout.persistent_elements;
  std::vector<void*> optimizer;
  for (int i = 0; i < 3; ++i) optimizer.push_back(persistent.allocate(4 * optimizer_elements, nullptr));
  memory["used_after_setup"] = used(backend);

  const std::size_t psi = layout.parameter_elements;
  const std::size_t states = layout.shard_bytes + layout.gradient_shard_bytes + layout.persistent_bytes +
                             layout.persistent_gradient_bytes + 12 * optimizer_elements;
  const double ideal = 16.0 * static_cast<double>(psi) / ranks;
  out["model"] = {{"blocks", blocks.size()},     {"layers", shape.layers},         {"hidden", shape.hidden},
                  {"intermediate", shape.intermediate}, {"vocab", shape.vocab},   {"parameters", psi},
                  {"persistent_parameters", layout.persistent_elements}};
  out["model_states"] = {{"parameter_shard_bytes", layout.shard_bytes},
                         {"gradient_shard_bytes", layout.gradient_shard_bytes},
                         {"persistent_bytes", layout.persistent_bytes + layout.persistent_gradient_bytes},
                         {"optimizer_bytes", 12 * optimizer_elements},
                         {"bytes", states},
                         {"ideal_16psi_over_n", ideal},
                         {"ratio", static_cast<double>(states) / ideal}};

  // Load every shard with its slice of the pattern, and the persistent parameters whole.
  device_io io(backend, std::size_t{128} << 20, threads);
  const stream_t compute = backend.create_stream();
  auto* shard = static_cast<unsigned char*>(m.shard_buffer().data);
  for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
    const block_layout& l = layout.blocks[b];
    const auto word = [b](std::size_t w) { return parameter_word(b, w); };
    const std::size_t t_first = (l.trainable.gathered_offset + static_cast<std::size_t>(rank) * l.trainable.shard_bytes) / 8;
    io.upload(shard + l.shard_offset, l.trainable.shard_bytes, compute,
              [&](void* h, std::size_t off, std::size_t n) { fill_words(h, n, t_first + off / 8, threads, word); });
    const std::size_t f_first = (l.frozen.gathered_offset + static_cast<std::size_t>(rank) * l.frozen.shard_bytes) / 8;
    io.upload(shard + l.shard_offset + l.trainable.shard_bytes, l.frozen.shard_bytes, compute,
              [&](void* h, std::size_t off, std::size_t n) { fill_words(h, n, f_first + off / 8, threads, word); });
    for (std::size_t p = 0; p < l.parameters.size(); ++p) {
      if (!l.parameters[p].persistent) continue;
      const view v = m.persistent_parameter(b, p);
      const std::size_t first = l.parameters[p].offset / 8;
      io.upload(v.data, v.bytes, compute, [&](void* h, std::size_t off, std::size_t n) {
        fill_words(h, n, first + off / 8, threads, persistent_word);
      });
    }
  }

  // A pinned tile of gradient values: element j is (j % 11) + rank.
  const data_type gtype = opts.gradient_type;
  const std::size_t es = size_of(gtype);
  constexpr std::size_t chunk = 11 * (std::size_t{1} << 20);
  void* tile = backend.allocate_host((chunk + 16) * es);
  if (tile == nullptr) throw std::runtime_error("cannot allocate the pinned gradient tile");
  for (std::size_t j = 0; j < chunk + 16; ++j) {
    const auto v = static_cast<float>(j % 11 + static_cast<std::size_t>(rank));
    if (gtype == data_type::float32) {
      std::memcpy(static_cast<unsigned char*>(tile) + 4 * j, &v, 4);
    } else {
      const std::uint16_t h = gtype == data_type::bfloat16 ? host_math::float_to_bf16(v) : host_math::float_to_fp16(v);
      std::memcpy(static_cast<unsigned char*>(tile) + 2 * j, &h, 2);
    }
  }
  const auto read_value = [gtype](const unsigned char* p) {
    if (gtype == data_type::float32) {
      float v = 0;
      std::memcpy(&v, p, 4);
      return v;
    }
    std::uint16_t h = 0;
    std::memcpy(&h, p, 2);
    return gtype == data_type::bfloat16 ? host_math::bf16_to_float(h) : host_math::fp16_to_float(h);
  };

  json verification = {{"gathered_blocks_checked", 0},  {"gathered_bad_words", 0}, {"gradient_elements_checked", 0},
                       {"gradient_mismatches", 0},      {"persistent_gradient_mismatches", 0}};
  std::size_t peak_used = used(backend);
  json steps = json::array();
  const std::size_t step_count = args.number("steps", 6);
  for (std::size_t step = 0; step < step_count; ++step) {
    const bool verify = step == 0 || step + 1 == step_count;
    const auto started = clock::now();
    for (std::size_t b = 0; b < layout.blocks.size(); ++b) {  // forward
      (void)m.fetch(b, compute);
      peak_used = std::max(peak_used, used(backend));
      if (verify) {
        const view g = m.gathered(b);
        std::size_t bad = 0;
        io.download(g.data, g.bytes, compute, [&](const void* h, std::size_t off, std::size_t n) {
          bad += count_mismatches(h, n, off / 8, threads, [b](std::size_t w) { return parameter_word(b, w); });
        });
        verification["gathered_blocks_checked"] = verification["gathered_blocks_checked"].get<std::size_t>() + 1;
        verification["gathered_bad_words"] = verification["gathered_bad_words"].get<std::size_t>() + bad;
      }
      m.release(b, compute);
    }
    std::vector<std::pair<view, std::size_t>> persistent_grads;  // view, pattern start c
    for (std::size_t b = layout.blocks.size(); b-- > 0;) {  // backward
      (void)m.fetch(b, compute);
      const std::span<const view> grads = m.begin_gradients(b, compute);
      if (verify) {
        for (std::size_t p = 0; p < grads.size(); ++p) {
          if (grads[p].data == nullptr) continue;
          const std::size_t c = (b * 7 + p * 3) % 11;
          const std::size_t n = grads[p].bytes / es;
          for (std::size_t k = 0; k < n; k += chunk) {
            backend.memcpy_async(static_cast<unsigned char*>(grads[p].data) + k * es,
                                 static_cast<unsigned char*>(tile) + c * es, std::min(chunk, n - k) * es, compute);
          }
          if (layout.blocks[b].parameters[p].persistent) persistent_grads.push_back({grads[p], c});
        }
      }
      m.reduce_gradients(b, compute);
      m.release(b, compute);
    }
    m.finish_gradients(compute);
    if (verify) {
      backend.synchronize_stream(compute);
      std::size_t checked = 0, bad = 0;
      for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
        const block_layout& l = layout.blocks[b];
        const std::size_t per_rank = l.trainable_shard_elements();
        const std::size_t lo = static_cast<std::size_t>(rank) * per_rank;
        io.download(m.gradient_shard(b).data, l.gradient_shard_bytes, compute,
                    [&](const void* h, std::size_t off, std::size_t n) {
                      const std::size_t e0 = lo + off / es, e1 = lo + (off + n) / es;  // flat element range
                      for (std::size_t p = 0; p < l.parameters.size(); ++p) {
                        const parameter_layout& param = l.parameters[p];
                        if (param.persistent || !param.trainable) continue;
                        const std::size_t g0 = param.gradient_offset / es, g1 = g0 + param.elements;
                        const std::size_t a = std::max(e0, g0), z = std::min(e1, g1);
                        if (a >= z) continue;
                        const std::size_t c = (b * 7 + p * 3) % 11;
                        std::atomic<std::size_t> wrong{0};
                        parallel_for(z - a, threads, [&](std::size_t begin, std::size_t end) {
                          std::size_t local = 0;
                          for (std::size_t k = begin; k < end; ++k) {
                            const std::size_t e = a + k;
                            const float got = read_value(static_cast<const unsigned char*>(h) + (e - e0) * es);
                            if (got != gradient_expected(ranks, c, e - g0)) ++local;
                          }
                          wrong += local;
                        });
                        checked += z - a;
                        bad += wrong.load();
                      }
                    });
      }
      std::size_t persistent_bad = 0;
      for (const auto& [v, c] : persistent_grads) {
        io.download(v.data, v.bytes, compute, [&](const void* h, std::size_t off, std::size_t n) {
          for (std::size_t k = 0; k < n / es; ++k) {
            const std::size_t i = off / es + k;
            if (read_value(static_cast<const unsigned char*>(h) + k * es) != gradient_expected(ranks, c, i)) {
              ++persistent_bad;
            }
          }
        });
      }
      verification["gradient_elements_checked"] = verification["gradient_elements_checked"].get<std::size_t>() + checked;
      verification["gradient_mismatches"] = verification["gradient_mismatches"].get<std::size_t>() + bad;
      verification["persistent_gradient_mismatches"] =
          verification["persistent_gradient_mismatches"].get<std::size_t>() + persistent_bad;
    }
    m.end_step(compute);
    m.synchronize();
    backend.synchronize_stream(compute);
    steps.push_back({{"step", step}, {"verify", verify}, {"seconds", seconds_since(started)}});
  }
  memory["used_peak_steps"] = peak_used;

  // All-gather bandwidth through the manager: fetch and release every block,
  // forward order, prefetching along the recorded order.
  std::size_t gathered_per_pass = 0, shard_per_pass = 0;
  json sizes = json::array();
  for (const block_layout& l : layout.blocks) {
    gathered_per_pass += l.gathered_bytes;
    shard_per_pass += l.shard_bytes;
    if (l.shard_bytes > 0) sizes.push_back(l.shard_bytes);
  }
  const std::size_t iterations = args.number("bandwidth-iterations", 10);
  const auto bandwidth = [&](double secs, std::size_t passes) {
    const double alg = static_cast<double>(gathered_per_pass * passes) / secs;
    return json{{"seconds", secs}, {"passes", passes}, {"algbw_gbps", alg / 1e9},
                {"busbw_gbps", alg * (ranks - 1) / ranks / 1e9}};
  };
  const auto manager_pass = [&] {
    for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
      (void)m.fetch(b, compute);
      m.release(b, compute);
    }
    m.end_step(compute);
  };
  manager_pass();
  m.synchronize();
  backend.synchronize_stream(compute);
  auto started = clock::now();
  for (std::size_t i = 0; i < iterations; ++i) manager_pass();
  m.synchronize();
  backend.synchronize_stream(compute);
  json bw;
  bw["manager"] = bandwidth(seconds_since(started), iterations);
  // The same gathers through the bare communicator into one buffer.
  void* recv = persistent.allocate(layout.max_gathered_bytes, nullptr);
  const stream_t raw_stream = backend.create_stream();
  const auto raw_pass = [&] {
    for (const block_layout& l : layout.blocks) {
      if (l.shard_bytes == 0) continue;
      const gather_part part{shard + l.shard_offset, recv, l.shard_bytes};
      comm.all_gather(std::span(&part, 1), raw_stream, "bandwidth");
    }
  };
  raw_pass();
  comm.synchronize();
  backend.synchronize_stream(raw_stream);
  started = clock::now();
  for (std::size_t i = 0; i < iterations; ++i) raw_pass();
  comm.synchronize();
  backend.synchronize_stream(raw_stream);
  bw["communicator"] = bandwidth(seconds_since(started), iterations);
  bw["shard_sizes"] = sizes;
  out["bandwidth"] = bw;
  persistent.deallocate(recv, layout.max_gathered_bytes, nullptr);
  backend.destroy_stream(raw_stream);

  const zero3_stats s = m.stats();
  memory["used_end"] = used(backend);
  const std::size_t expected = states + s.bucket_bytes + s.gathered.peak;
  memory["expected_model_states_buckets_gathered_peak"] = expected;
  memory["measured_setup_delta"] = memory["used_after_setup"].get<std::size_t>() - memory["used_after_comm"].get<std::size_t>();
  memory["measured_peak_delta"] = peak_used - memory["used_after_comm"].get<std::size_t>();
  memory["measured_over_expected"] =
      static_cast<double>(memory["measured_peak_delta"].get<std::size_t>()) / static_cast<double>(expected);
  out["memory"] = memory;
  out["gather_budget"] = {{"max_live_bytes", opts.max_live_bytes},
                          {"prefetch_bytes", opts.prefetch_bytes},
                          {"gathered_peak", s.gathered.peak},
                          {"bucket_bytes", s.bucket_bytes}};
  out["verification"] = verification;
  out["steps"] = steps;
  out["zero3"] = json::parse(to_json(s));
  out["allocators"] = {{"persistent", json::parse(to_json(persistent.stats()))},
                       {"transient", json::parse(to_json(transient.stats()))}};
  run.ok = verification["gathered_bad_words"] == 0 && verification["gradient_mismatches"] == 0 &&
           verification["persistent_gradient_mismatches"] == 0 &&
           verification["gathered_blocks_checked"].get<std::size_t>() > 0;

  backend.free_host(tile, (chunk + 16) * es);
  for (void* p : optimizer) persistent.deallocate(p, 4 * optimizer_elements, nullptr);
  backend.synchronize_stream(compute);
  backend.destroy_stream(compute);
}

void report(rank_run& run, const std::string& dir) {
  run.out["ok"] = run.ok;
  const std::string path = fmt::format("{}/zero3-rank{}.json", dir, run.comm.rank());
  std::ofstream(path) << run.out.dump(2) << "\n";
  const json& o = run.out;
  if (!o.contains("memory")) {
    fmt::print("rank {}: FAILED: {}\n", run.comm.rank(), o.value("error", std::string("?")));
    return;
  }
  fmt::print(
      "rank {}: {} | params {:.3f} B | model states {:.3f} GB = {:.4f} x 16Psi/N | peak device delta {:.3f} GB vs "
      "expected {:.3f} GB | gathered peak {:.3f} GB (budget {:.3f}) | all-gather busbw manager {:.1f} GB/s, "
      "communicator {:.1f} GB/s | bad words {} grad mismatches {}\n",
      run.comm.rank(), run.ok ? "OK" : "FAILED", o["model"]["parameters"].get<double>() / 1e9,
      o["model_states"]["bytes"].get<double>() / 1e9, o["model_states"]["ratio"].get<double>(),
      o["memory"]["measured_peak_delta"].get<double>() / 1e9,
      o["memory"]["expected_model_states_buckets_gathered_peak"].get<double>() / 1e9,
      o["gather_budget"]["gathered_peak"].get<double>() / 1e9, o["gather_budget"]["max_live_bytes"].get<double>() / 1e9,
      o["bandwidth"]["manager"]["busbw_gbps"].get<double>(), o["bandwidth"]["communicator"]["busbw_gbps"].get<double>(),
      o["verification"]["gathered_bad_words"].get<std::size_t>(), o["verification"]["gradient_mismatches"].get<std::size_t>());
}

int run_and_report(const arguments& args, device_backend& backend, communicator& comm, const std::string& dir) {
  rank_run run{args, backend, comm, json::object()};
  run.out["rank"] = comm.rank();
  run.out["world_size"] = comm.size();
  run.out["backend"] = std::string(backend.name());
  run.out["device"] = backend.device();
  run.out["communicator"] = std::string(comm.name());
  try {
    run_rank(run);
  } catch (const std::exception& e) {
    run.ok = false;
    run.out["error"] = e.what();
  }
  report(run, dir);
  return run.ok ? 0 : 1;
}

int main_impl(int argc, char** argv) {
  const arguments args = parse_arguments(argc, argv);
  const std::string dir = args.text("out", ".");
  const int size = static_cast<int>(args.number("size", 1));
  const auto timeout = std::chrono::milliseconds(args.number("timeout-ms", 120000));
  if (args.text("backend", "cuda") == "sim") {
    auto group = make_thread_group(size, timeout);
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        sim_backend backend(sim_options{.capacity = args.number("sim-capacity-mib", 8192) * MiB, .backed = true, .device = r});
        auto comm = make_thread_communicator(group, r, backend);
        failures += run_and_report(args, backend, *comm, dir);
      });
    }
    for (std::thread& t : threads) t.join();
    return failures.load() == 0 ? 0 : 1;
  }
  auto backend = make_cuda_backend(static_cast<int>(args.number("device", 0)));
  const std::size_t used_start = used(*backend);
  nccl_options o;
  o.rank = static_cast<int>(args.number("rank", 0));
  o.size = size;
  o.unique_id_file = args.text("id-file", "");
  o.timeout = timeout;
  const auto started = clock::now();
  auto comm = make_nccl_communicator(*backend, o);
  fmt::print("rank {}: NCCL communicator of {} ranks ready in {:.2f} s (device used at start {:.2f} GB)\n", o.rank,
             o.size, seconds_since(started), static_cast<double>(used_start) / 1e9);
  return run_and_report(args, *backend, *comm, dir);
}

}  // namespace
}  // namespace zero3_driver

int main(int argc, char** argv) {
  try {
    return zero3_driver::main_impl(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_zero3: {}\n", e.what());
    return 2;
  }
}
