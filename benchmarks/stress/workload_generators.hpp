// Synthetic training workloads that fragment badly (docs/benchmarks-guide.md,
// "Fragmentation stress"), as plain sequences of allocations and frees.
//
// Header-only and standard C++ only: bench_stress (fragctl) and torch_replay
// (PyTorch's allocator, built against torch instead of fragctl) include it,
// so both replay the very same workloads.
//
// Each scenario is a generator: (scale, steps) -> the allocations and frees
// a training job of that size makes. `scale` multiplies what grows with the
// batch (the tokens per step, hence every activation); parameters and
// optimizer state stay. The same (scenario, scale, steps) always gives the
// same sequence, on every machine (no standard-library distributions).
//
//  * llm_varlen: a GPT-2-medium-shaped decoder (24 layers, width 1024,
//    vocabulary 50304) trained with bf16 autocast and a foreach AdamW, batch
//    8 x scale, sequence length drawn per step from 128..1024: every
//    activation changes size from step to step; optimizer state appears at
//    the first step, after the first activations were freed.
//  * mixed_lifetimes: short-lived blocks (64 KiB..128 MiB, freed within a
//    few dozen allocations) interleaved with long-lived ones (1..32 MiB,
//    living 3..25 steps): the long-lived ones pin the memory the short-lived
//    ones leave.
//  * zero3: ZeRO-3 over 8 ranks, one rank's view: sharded parameters, master
//    weights, gradients and Adam state live throughout; each module's full
//    parameters are gathered before use (one module prefetched ahead) and
//    released after, forward and backward; modules have many different sizes
//    (widths 1536..4096, MLP ratios 8/3..4); tokens per step vary +-50%
//    around 4096 x scale.
//
// Step k's events are [step_end[k-1], step_end[k]); the events after the last
// step free what lived throughout (teardown).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fragctl::bench::gen {

inline constexpr std::size_t kib = std::size_t{1} << 10;
inline constexpr std::size_t mib = std::size_t{1} << 20;

/// One allocation (id fresh) or free (id of a live block, its size).
struct event {
  bool alloc;
  std::uint64_t id;
  std::size_t bytes;
  std::uint32_t step;  ///< step the event belongs to; == steps for teardown
};

struct plan {
  std::vector<event> events;
  std::vector<std::size_t> step_end;  ///< one past the last event of each step
  std::size_t peak_live = 0;          ///< peak of the bytes live at once
};

namespace detail {

using block_id = std::uint64_t;

// Deterministic random numbers independent of the standard library's
// distributions (splitmix64), so a workload is the same on every machine.
class random_source {
 public:
  explicit random_source(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double unit() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [lo, hi].
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) noexcept { return lo + next() % (hi - lo + 1); }
  /// Log-uniform size in [lo, hi].
  std::size_t log_uniform(std::size_t lo, std::size_t hi) noexcept {
    const double a = std::log(static_cast<double>(lo));
    const double b = std::log(static_cast<double>(hi));
    return static_cast<std::size_t>(std::exp(a + (b - a) * unit()));
  }

 private:
  std::uint64_t state_;
};

// Appends events to a workload and keeps the live set.
class builder {
 public:
  explicit builder(plan& w) : w_(w) {}

  block_id alloc(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 1);
    const block_id id = next_++;
    push(true, id, bytes);
    live_.emplace(id, bytes);
    live_bytes_ += bytes;
    w_.peak_live = std::max(w_.peak_live, live_bytes_);
    return id;
  }

  void free(block_id id) {
    const auto it = live_.find(id);
    if (it == live_.end()) throw std::logic_error("workload: block " + std::to_string(id) + " freed twice");
    push(false, id, it->second);
    live_bytes_ -= it->second;
    live_.erase(it);
  }

  void free_all(std::vector<block_id>& ids) {
    for (const block_id id : ids) free(id);
    ids.clear();
  }

  void end_step() {
    w_.step_end.push_back(w_.events.size());
    ++step_;
  }

  // Frees what is still live (persistent state) after the last step.
  void finish() {
    std::vector<block_id> rest;
    for (const auto& [id, bytes] : live_) rest.push_back(id);
    std::sort(rest.begin(), rest.end());
    free_all(rest);
  }

 private:
  void push(bool alloc, block_id id, std::size_t bytes) {
    w_.events.push_back({alloc, id, bytes, static_cast<std::uint32_t>(step_)});
  }

  plan& w_;
  block_id next_ = 1;
  std::unordered_map<block_id, std::size_t> live_;
  std::size_t live_bytes_ = 0;
  std::size_t step_ = 0;
};

inline std::size_t scaled(double x) { return static_cast<std::size_t>(std::llround(std::max(1.0, x))); }

// --- llm_varlen -----------------------------------------------------------------

struct parameter {
  std::size_t numel;
  block_id weight = 0, grad = 0, exp_avg = 0, exp_avg_sq = 0;
};

inline void llm_varlen(builder& b, double scale, std::size_t steps) {
  constexpr std::size_t layers = 24, h = 1024, vocab = 50304, max_seq = 1024, heads = 16, base_batch = 8;
  random_source rng(0x5EED0001);

  // Parameters (fp32), in the order a module registers them.
  std::vector<parameter> params;
  const auto add = [&](std::size_t numel) {
    params.push_back({numel});
    return params.size() - 1;
  };
  const std::size_t tok = add(vocab * h), pos = add(max_seq * h);
  struct layer_params {
    std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, outw, outb;
  };
  std::vector<layer_params> lp;
  for (std::size_t l = 0; l < layers; ++l) {
    lp.push_back({add(h), add(h), add(3 * h * h), add(3 * h), add(h * h), add(h), add(h), add(h), add(4 * h * h),
                  add(4 * h), add(4 * h * h), add(h)});
  }
  const std::size_t lnfw = add(h), lnfb = add(h);
  for (parameter& p : params) p.weight = b.alloc(p.numel * 4);

  const auto ensure_grad = [&](std::size_t i) {
    if (params[i].grad == 0) params[i].grad = b.alloc(params[i].numel * 4);
  };
  // Weight gradient of a linear layer: computed in bf16, accumulated in fp32.
  const auto weight_grad = [&](std::size_t w, std::size_t bias) {
    const block_id tmp = b.alloc(params[w].numel * 2);
    ensure_grad(w);
    ensure_grad(bias);
    b.free(tmp);
  };

  for (std::size_t step = 0; step < steps; ++step) {
    const std::size_t seq = 64 * rng.between(2, max_seq / 64);
    const std::size_t n = scaled(scale * static_cast<double>(base_batch * seq));  // tokens this step
    const block_id idx = b.alloc(n * 8), targets = b.alloc(n * 8);

    // Forward.
    const block_id tok_out = b.alloc(n * h * 4), pos_out = b.alloc(seq * h * 4);
    block_id x = b.alloc(n * h * 4);
    b.free(tok_out);
    b.free(pos_out);
    std::vector<std::vector<block_id>> saved(layers);
    for (std::size_t l = 0; l < layers; ++l) {
      std::vector<block_id>& s = saved[l];
      s.push_back(x);  // layer input, for ln1's backward
      const block_id ln1 = b.alloc(n * h * 4);
      s.push_back(b.alloc(n * 4));
      s.push_back(b.alloc(n * 4));
      s.push_back(b.alloc(n * h * 2));  // ln1 output in bf16
      b.free(ln1);
      s.push_back(b.alloc(3 * h * h * 2));  // qkv weight cast
      s.push_back(b.alloc(n * 3 * h * 2));  // q, k, v
      s.push_back(b.alloc(n * h * 2));      // attention output
      s.push_back(b.alloc(n * heads * 4));  // logsumexp
      s.push_back(b.alloc(h * h * 2));      // proj weight cast
      const block_id proj = b.alloc(n * h * 2);
      const block_id x1 = b.alloc(n * h * 4);
      b.free(proj);
      s.push_back(x1);
      const block_id ln2 = b.alloc(n * h * 4);
      s.push_back(b.alloc(n * 4));
      s.push_back(b.alloc(n * 4));
      s.push_back(b.alloc(n * h * 2));
      b.free(ln2);
      s.push_back(b.alloc(4 * h * h * 2));  // fc weight cast
      s.push_back(b.alloc(n * 4 * h * 2));  // fc output (gelu input)
      s.push_back(b.alloc(n * 4 * h * 2));  // gelu output
      s.push_back(b.alloc(4 * h * h * 2));  // out weight cast
      const block_id out = b.alloc(n * h * 2);
      x = b.alloc(n * h * 4);
      b.free(out);
    }
    std::vector<block_id> head = {x, b.alloc(n * 4), b.alloc(n * 4)};
    const block_id lnf = b.alloc(n * h * 4);
    head.push_back(b.alloc(n * h * 2));
    b.free(lnf);
    head.push_back(b.alloc(vocab * h * 2));  // tied head weight cast
    const block_id logits = b.alloc(n * vocab * 2);
    const block_id logits_f = b.alloc(n * vocab * 4);
    const block_id log_probs = b.alloc(n * vocab * 4);
    b.free(logits_f);
    const block_id loss = b.alloc(4);
    b.free(logits);

    // Backward.
    const block_id g_lp = b.alloc(n * vocab * 4);
    b.free(log_probs);
    const block_id g_logits = b.alloc(n * vocab * 2);
    b.free(g_lp);
    const block_id g_lnf = b.alloc(n * h * 2);
    weight_grad(tok, tok);
    b.free(g_logits);
    block_id g = b.alloc(n * h * 4);
    b.free(g_lnf);
    ensure_grad(lnfw);
    ensure_grad(lnfb);
    b.free_all(head);
    for (std::size_t l = layers; l-- > 0;) {
      const layer_params& p = lp[l];
      const block_id g_o = b.alloc(n * h * 2);
      const block_id g_gelu = b.alloc(n * 4 * h * 2);
      weight_grad(p.outw, p.outb);
      b.free(g_o);
      const block_id g_fc = b.alloc(n * 4 * h * 2);
      b.free(g_gelu);
      const block_id g_ln2 = b.alloc(n * h * 2);
      weight_grad(p.fcw, p.fcb);
      b.free(g_fc);
      const block_id g_x1_part = b.alloc(n * h * 4);
      b.free(g_ln2);
      ensure_grad(p.ln2w);
      ensure_grad(p.ln2b);
      const block_id g_x1 = b.alloc(n * h * 4);
      b.free(g_x1_part);
      b.free(g);
      const block_id g_proj = b.alloc(n * h * 2);
      const block_id g_attn = b.alloc(n * h * 2);
      weight_grad(p.projw, p.projb);
      b.free(g_proj);
      const block_id g_qkv = b.alloc(n * 3 * h * 2);
      const block_id workspace = b.alloc(n * heads * 4);
      b.free(workspace);
      b.free(g_attn);
      const block_id g_ln1 = b.alloc(n * h * 2);
      weight_grad(p.qkvw, p.qkvb);
      b.free(g_qkv);
      const block_id g_x_part = b.alloc(n * h * 4);
      b.free(g_ln1);
      ensure_grad(p.ln1w);
      ensure_grad(p.ln1b);
      g = b.alloc(n * h * 4);
      b.free(g_x_part);
      b.free(g_x1);
      b.free_all(saved[l]);
    }
    const block_id g_emb = b.alloc(n * h * 4);
    ensure_grad(pos);
    b.free(g_emb);
    b.free(g);
    b.free(idx);
    b.free(targets);
    b.free(loss);

    // AdamW (foreach): state appears at the first step; one list of
    // temporaries the size of every parameter lives at once.
    for (parameter& p : params) {
      if (p.exp_avg == 0) {
        p.exp_avg = b.alloc(p.numel * 4);
        p.exp_avg_sq = b.alloc(p.numel * 4);
      }
    }
    std::vector<block_id> temps;
    for (const parameter& p : params) temps.push_back(b.alloc(p.numel * 4));
    b.free_all(temps);
    for (parameter& p : params) {  // zero_grad(set_to_none=True)
      if (p.grad != 0) b.free(p.grad);
      p.grad = 0;
    }
    b.end_step();
  }
}

// --- mixed_lifetimes --------------------------------------------------------------

inline void mixed_lifetimes(builder& b, double scale, std::size_t steps) {
  constexpr std::size_t per_step = 300;
  random_source rng(0x5EED0002);
  std::multimap<std::size_t, block_id> short_due;  // allocation index -> block
  std::multimap<std::size_t, block_id> long_due;   // step -> block
  std::size_t index = 0;
  for (std::size_t step = 0; step < steps; ++step) {
    for (auto it = long_due.begin(); it != long_due.end() && it->first <= step;) {
      b.free(it->second);
      it = long_due.erase(it);
    }
    for (std::size_t k = 0; k < per_step; ++k, ++index) {
      for (auto it = short_due.begin(); it != short_due.end() && it->first <= index;) {
        b.free(it->second);
        it = short_due.erase(it);
      }
      const std::size_t bytes = scaled(scale * static_cast<double>(rng.log_uniform(64 * kib, 128 * mib)));
      short_due.emplace(index + rng.between(1, 96), b.alloc(bytes));
      if (rng.unit() < 0.08) {
        const std::size_t long_bytes = scaled(scale * static_cast<double>(rng.log_uniform(1 * mib, 32 * mib)));
        long_due.emplace(step + rng.between(3, 25), b.alloc(long_bytes));
      }
    }
    b.end_step();
  }
  for (const auto& [due, id] : short_due) b.free(id);
  for (const auto& [due, id] : long_due) b.free(id);
}

// --- zero3 ----------------------------------------------------------------------

inline void zero3(builder& b, double scale, std::size_t steps) {
  constexpr std::size_t world = 8, layers = 24, base_tokens = 4096;
  random_source rng(0x5EED0003);
  struct module {
    std::size_t params;       // full parameter count
    std::size_t act_width;    // activation bytes saved per token
    std::size_t temp_width;   // transient bytes per token
    std::vector<block_id> shards;
  };
  std::vector<module> modules;
  constexpr std::size_t widths[] = {1536, 2048, 2560, 3072, 4096};
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t h = widths[rng.between(0, std::size(widths) - 1)];
    const std::size_t ratio_x3 = rng.between(8, 12);  // MLP width ratio 8/3 .. 4, in thirds
    const std::size_t f = h * ratio_x3 / 3 / 128 * 128;
    modules.push_back({4 * h * h, 5 * h * 2, 2 * h * 2, {}});   // attention
    modules.push_back({3 * h * f, 3 * f * 2, 2 * f * 2, {}});   // SwiGLU MLP
  }
  // Persistent per-rank state: bf16 shard, fp32 master, gradient and Adam m, v.
  for (module& m : modules) {
    const std::size_t shard = m.params / world;
    for (const std::size_t bytes_per : {2, 4, 4, 4, 4}) m.shards.push_back(b.alloc(shard * bytes_per));
  }
  const auto gather = [&](std::size_t i) { return b.alloc(modules[i].params * 2); };

  for (std::size_t step = 0; step < steps; ++step) {
    const double variation = 0.5 + rng.unit();  // tokens +-50%
    const std::size_t n = scaled(scale * variation * static_cast<double>(base_tokens));
    std::vector<std::vector<block_id>> saved(modules.size());

    // Forward: module i computes while module i+1 is being gathered.
    block_id current = gather(0);
    for (std::size_t i = 0; i < modules.size(); ++i) {
      const block_id next = i + 1 < modules.size() ? gather(i + 1) : 0;
      const block_id temp = b.alloc(n * modules[i].temp_width);
      saved[i].push_back(b.alloc(n * modules[i].act_width));
      saved[i].push_back(b.alloc(n * 4));
      b.free(temp);
      b.free(current);
      current = next;
    }
    // Backward: gather again (prefetching the previous module), full
    // gradient, reduce-scatter into the persistent shard, release.
    current = gather(modules.size() - 1);
    for (std::size_t i = modules.size(); i-- > 0;) {
      const block_id next = i > 0 ? gather(i - 1) : 0;
      const block_id g_in = b.alloc(n * modules[i].temp_width);
      const block_id full_grad = b.alloc(modules[i].params * 2);
      const block_id scatter = b.alloc(modules[i].params / world * 4);
      b.free(full_grad);
      b.free(scatter);
      b.free_all(saved[i]);
      b.free(g_in);
      b.free(current);
      current = next;
    }
    // Optimizer on the shards: one temporary per module.
    for (const module& m : modules) b.free(b.alloc(m.params / world * 4));
    b.end_step();
  }
}

}  // namespace detail

/// "llm_varlen", "mixed_lifetimes", "zero3".
inline const std::vector<std::string>& scenario_names() {
  static const std::vector<std::string> names = {"llm_varlen", "mixed_lifetimes", "zero3"};
  return names;
}

/// Default number of training steps of a scenario.
inline std::size_t default_steps(std::string_view scenario) { return scenario == "mixed_lifetimes" ? 40 : 8; }

/// Builds `scenario` at `scale` (> 0) for `steps` steps (0: the default).
/// Throws std::invalid_argument for an unknown scenario or a scale <= 0.
inline plan generate(std::string_view scenario, double scale, std::size_t steps = 0) {
  if (!(scale > 0)) throw std::invalid_argument("workload: scale must be positive");
  if (steps == 0) steps = default_steps(scenario);
  plan w;
  detail::builder b(w);
  if (scenario == "llm_varlen") {
    detail::llm_varlen(b, scale, steps);
  } else if (scenario == "mixed_lifetimes") {
    detail::mixed_lifetimes(b, scale, steps);
  } else if (scenario == "zero3") {
    detail::zero3(b, scale, steps);
  } else {
    throw std::invalid_argument("unknown scenario \"" + std::string(scenario) +
                                "\"; accepted: llm_varlen, mixed_lifetimes, zero3");
  }
  b.finish();
  return w;
}

}  // namespace fragctl::bench::gen
