// The allocation-sequence harness: an arbitrary byte string becomes a policy
// (one of policy_cases, with a few options varied) under a stream_use_adaptor
// and a statistics_adaptor, as allocator_stack stacks them, a sim device, and
// a program of allocations, frees, misuse, record_stream calls, stream work,
// injected backend failures and cache releases, checked step by step against
// a block_model.
//
// record_stream(p, s) on a live block makes its free wait (be deferred) until
// every recorded stream has passed the free; on any other pointer (freed,
// interior, foreign, a block whose free already waits) it records nothing.
// The harness keeps the streams it recorded per live block and, in order,
// the frees that must wait; the adaptor hands those back oldest first, and
// only inside allocate and release_cached, so the count it reports
// (deferred()) tells which of them went back.
//
// Invariants checked (a violation throws invariant_violation):
//  * every block returned is non-null, 512-aligned, accessible on the device
//    (mapped with access granted, or inside a raw allocation), and overlaps
//    no live block, no block whose free waits, nor a block freed on another
//    stream whose work has not completed (the stream-order rule; ground truth
//    is an event the harness records right after the free on the freeing
//    stream and on each stream recorded for the block);
//  * the pool's allocated bytes equal the sum of allocation_size over live
//    blocks and blocks whose free waits; the statistics' allocated bytes that
//    sum over live blocks only, their requested bytes the sum of requests
//    (until a free with a wrong size names the rounded size, which makes the
//    requested figure the policy's guess), and the backend's held bytes what
//    the sim device has in use;
//  * a free defers exactly when the program recorded a stream for the block
//    (deferred() grows by one then, else not at all); nothing but allocate
//    and release_cached hands a deferred free back; release_cached and an
//    allocation that ends in out_of_memory leave none waiting, nor does any
//    allocation where work completes at once; record_stream changes nothing
//    a caller sees;
//  * a correct free succeeds; a free with a wrong size frees the block and
//    names its size, whether reported or taken as right (caching takes the
//    rounded size); it is reported once (when the caller frees,
//    never again when a deferred free is handed back: the allocators below
//    the adaptor see no misuse); a free of a pointer that is not a live
//    block (interior, freed before, a block whose free waits, host memory) is
//    not_owned and changes nothing; misuse counters equal the misuse the
//    program did;
//  * out_of_memory changes nothing a caller sees; an injected failure of an
//    allocating call (allocate, create_physical, map, set_access) never
//    surfaces as anything but out_of_memory (no backend_error, no crash); an
//    injected unmap or release_physical failure (a runtime error) surfaces,
//    if at all, as that backend_error ("injected_fault") from allocate or
//    release_cached, and changes nothing a caller sees either;
//    sizes above 2^62 are invalid_argument, 0 bytes nullptr;
//  * every segment of the memory map is accessible on the device (no
//    mapping is left without access after a failure midway), and the bare
//    arena's reserved bytes are what the device has mapped;
//  * in backed mode every live block keeps its data across everything;
//  * at the end (faults cleared), with every block freed, allocated is 0, and
//    once the policy is destroyed the sim device holds nothing: no allocation, handle,
//    mapping, reservation or event, and 0 bytes in use. A constructor that
//    fails leaves nothing behind either.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fragctl/adaptors.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/memory_map.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fuzz/harness/block_model.hpp"
#include "fuzz/harness/byte_reader.hpp"
#include "fuzz/harness/policy_cases.hpp"

namespace fragctl::fuzz {

/// What one run did, for tests that want to see the harness was exercised.
struct sequence_summary {
  std::string expression;
  bool constructed = false;
  std::size_t allocations = 0;
  std::size_t ooms = 0;
  std::size_t frees = 0;
  std::size_t misuse = 0;
  std::size_t deferred = 0;  ///< frees that waited for recorded streams
  std::size_t streams_ended = 0;  ///< stream_ending calls, each stream destroyed and replaced
};

/// Checks that a sim device holds nothing at all.
inline void check_device_empty(const sim_backend& sim, const char* when) {
  const sim_backend::live_objects l = sim.live();
  check(l.allocations == 0 && l.physical == 0 && l.mappings == 0 && l.reservations == 0 && l.events == 0 &&
            l.streams == 0 && l.host == 0 && sim.used_bytes() == 0,
        "{}: the sim device still holds allocations {}, handles {}, mappings {}, reservations {}, events {}, "
        "streams {}, host {}, {} bytes",
        when, l.allocations, l.physical, l.mappings, l.reservations, l.events, l.streams, l.host,
        sim.used_bytes());
}

class alloc_sequence {
 public:
  explicit alloc_sequence(byte_reader& in) : in_(in) {}

  sequence_summary run() {
    setup();
    sim_ = std::make_unique<sim_backend>(options_);
    if (construction_fault_) sim_->fail_nth(construction_fault_target_, construction_fault_nth_);
    std::unique_ptr<device_allocator> policy;
    try {
      policy = make_policy(case_.expression, cfg_, *sim_);
    } catch (const std::bad_alloc&) {
      check_device_empty(*sim_, "after a constructor ran out of memory");
      return summary_;
    } catch (const backend_error& e) {
      if (e.code_name() != "injected_fault") {
        throw invariant_violation(
            fmt::format("constructing {}: backend_error escaped: {}", summary_.expression, e.what()));
      }
      check_device_empty(*sim_, "after a constructor met a failed unmap or release");
      return summary_;
    }
    summary_.constructed = true;
    if (limit_ != 0) policy = std::make_unique<limiting_adaptor>(std::move(policy), limit_);
    auto uses = std::make_unique<stream_use_adaptor>(std::move(policy));
    stream_uses_ = uses.get();
    top_ = std::make_unique<statistics_adaptor>(std::move(uses));
    streams_[0] = nullptr;
    for (std::size_t i = 1; i < streams_.size(); ++i) streams_[i] = sim_->create_stream();

    while (!in_.empty() && step_ < max_steps) {
      ++step_;
      operation(in_.byte());
      check_counters();
    }
    teardown();
    return summary_;
  }

 private:
  static constexpr std::size_t max_steps = 4096;
  static constexpr std::array fault_targets = {sim_fault_target::allocate, sim_fault_target::create_physical,
                                               sim_fault_target::map,      sim_fault_target::set_access,
                                               sim_fault_target::unmap,    sim_fault_target::release_physical};

  struct pending_free {
    std::uintptr_t address;
    std::size_t bytes;
    stream_t stream;
    event_t done;  ///< recorded on `stream` right after the free
  };
  /// A free the stream_use_adaptor must hold until the recorded streams pass it.
  struct deferred_free {
    std::uintptr_t address;
    std::size_t bytes;
    std::size_t rounded;
  };

  void setup() {
    case_ = policy_cases[in_.below(policy_cases.size())];
    const std::uint8_t flags = in_.byte();
    const std::uint8_t tweaks = in_.byte();
    options_.backed = (flags & 1) != 0;
    options_.manual_completion = (flags & 2) != 0;
    options_.granularity = (flags & 4) != 0 ? 64 * KiB : 2 * MiB;
    options_.virtual_memory = case_.virtual_memory;
    // Small devices where memory is real or granules are small (a run maps
    // at most a few thousand granules); up to 16 GiB of fake memory else.
    const std::size_t capacity_index = (flags >> 4) & 3;
    const bool small = options_.backed || options_.granularity < 2 * MiB;
    options_.capacity = small ? (32 * MiB) << capacity_index
                              : std::array{64 * MiB, 256 * MiB, GiB, 16 * GiB}[capacity_index];
    if ((flags & 8) != 0) limit_ = options_.capacity / 2;
    if ((flags & 64) != 0) {
      construction_fault_ = true;
      construction_fault_target_ = fault_targets[in_.below(fault_targets.size())];
      construction_fault_nth_ = 1 + in_.below(8);
    }
    std::string conf(case_.conf);
    if ((tweaks & 1) != 0) conf += ",release_threshold:8MiB";
    if ((tweaks & 2) != 0) conf += ",max_split_size:4MiB";
    if ((tweaks & 4) != 0) conf += ",slab_reserve:0";
    if ((tweaks & 8) != 0) conf += ",buckets_limit:64KiB";
    if ((tweaks & 16) != 0) conf += ",warmup_on_exhausted:fail";
    if ((tweaks & 32) != 0) conf += ",release_on_oom:false";
    if ((tweaks & 64) != 0) conf += ",map_chunk:0";  // arena: one handle per granule
    if ((tweaks & 128) != 0) conf += ",map_chunk:1MiB";
    auto parsed = parse_config(conf);
    check(parsed.ok(), "harness configuration \"{}\" does not parse", conf);
    cfg_ = *std::move(parsed);
    summary_.expression = fmt::format("{} [{}{}{}, capacity {}, granularity {}{}]", case_.expression, conf,
                                      options_.backed ? " backed" : "", options_.manual_completion ? " manual" : "",
                                      options_.capacity, options_.granularity, limit_ != 0 ? " limited" : "");
  }

  void operation(std::uint8_t op) {
    switch (op % 17) {
      case 0: case 1: case 2: case 3: allocate_somewhere(); break;
      case 4: case 5: free_one(false); break;
      case 6: free_one(true); break;
      case 7: free_not_owned(); break;
      case 8: sim_->submit(pick_stream()); break;
      case 9: complete(); break;
      case 10: inject_fault(); break;
      case 11: release_cached(); break;
      case 12: check_all(); break;
      case 13: edge_sizes(); break;
      case 14: burst(); break;
      case 15: free_many(); break;
      default: record_use(); break;
    }
  }

  // --- choices ---------------------------------------------------------------
  //
  // Every read of the input is a statement of its own, or one operand
  // sequenced before the next: the order in which a compiler evaluates
  // function arguments or the operands of `+` is unspecified (GCC and clang
  // differ), and an input must run the same program in the clang fuzzer and
  // in the GCC test suite that replays it.

  stream_t pick_stream() { return streams_[in_.below(streams_.size())]; }

  std::size_t log_uniform(std::size_t lo, std::size_t hi) {
    // 16 bits of input pick a point on a log scale between lo and hi.
    const unsigned lo_bits = static_cast<unsigned>(std::bit_width(lo));
    const unsigned hi_bits = static_cast<unsigned>(std::bit_width(hi));
    const unsigned bits = lo_bits + static_cast<unsigned>(in_.below(hi_bits - lo_bits + 1));
    const std::size_t top = std::size_t{1} << (bits == 0 ? 0 : bits - 1);
    const std::size_t n = top + static_cast<std::size_t>(in_.integer(2)) * top / 65536;
    return std::clamp(n, lo, hi);
  }

  std::size_t pick_size() {
    const std::size_t g = options_.granularity;
    switch (in_.byte() % 8) {
      case 0: return 1 + in_.below(4096);
      case 1: return min_alignment * (1 + in_.below(16));
      case 2: return log_uniform(4 * KiB, MiB);
      case 3: return MiB + in_.below(3) * min_alignment - min_alignment;
      case 4: {
        const std::size_t granules = 1 + in_.below(8);
        return g * granules + in_.below(3) - 1;
      }
      case 5: return log_uniform(MiB, 64 * MiB);
      case 6: return options_.capacity / (2 + in_.below(7));
      default: return 1 + static_cast<std::size_t>(in_.integer(3));
    }
  }

  // An address inside a live block (the model is not empty): 512 to 4 KiB
  // past its start, or one byte before that.
  std::uintptr_t inside_a_live_block() {
    const auto start = reinterpret_cast<std::uintptr_t>(model_.at(in_.below(model_.size())).first);
    const std::size_t offset = min_alignment * (1 + in_.below(8));
    return start + offset - (in_.byte() & 1);
  }

  // --- operations ----------------------------------------------------------------

  void allocate_somewhere() {
    const std::size_t bytes = pick_size();
    allocate_one(bytes, pick_stream());
  }

  bool allocate_one(std::size_t bytes, stream_t stream) {
    const std::size_t before = top_->state().allocated;
    void* p = nullptr;
    try {
      p = top_->allocate(bytes, stream);
    } catch (const std::bad_alloc&) {
      ++summary_.ooms;
      const std::size_t handed_back = take_handed_back("an allocation");
      check(deferred_.empty(), "out_of_memory for {} bytes left {} frees waiting for streams; it must wait for them",
            bytes, deferred_.size());
      check(top_->state().allocated == before - handed_back,
            "out_of_memory for {} bytes changed allocated from {} to {} ({} bytes of waiting frees handed back)", bytes,
            before, top_->state().allocated, handed_back);
      return false;
    } catch (const backend_error& e) {
      if (e.code_name() != "injected_fault") {
        throw invariant_violation(fmt::format("allocate({}): backend_error escaped: {}", bytes, e.what()));
      }
      const std::size_t handed_back = take_handed_back("an allocation");
      check_deferred_handed_back("a failed allocation");
      check(top_->state().allocated == before - handed_back,
            "a failed unmap or release during allocate({}) changed allocated from {} to {} ({} bytes of waiting frees "
            "handed back)",
            bytes, before, top_->state().allocated, handed_back);
      return false;
    } catch (const invalid_argument& e) {
      throw invariant_violation(fmt::format("allocate({}): invalid_argument for a valid size: {}", bytes, e.what()));
    }
    (void)take_handed_back("an allocation");
    check_deferred_handed_back("an allocation");
    const std::uint8_t id = next_id_;
    next_id_ = static_cast<std::uint8_t>(next_id_ % 250 + 1);
    model_.insert(p, bytes, top_->allocation_size(bytes), stream, id);
    check(sim_->accessible(p, bytes), "allocate({}) returned {}, which the device cannot access", bytes, p);
    check_not_waiting(reinterpret_cast<std::uintptr_t>(p), bytes);
    check_stream_order(reinterpret_cast<std::uintptr_t>(p), bytes, stream);
    if (options_.backed) stamp(p, bytes, id);
    ++summary_.allocations;
    return true;
  }

  // A block whose free waits for recorded streams is still the caller's
  // until the adaptor hands the free back (take_handed_back ran first).
  void check_not_waiting(std::uintptr_t a, std::size_t n) const {
    for (const deferred_free& d : deferred_) {
      check(!(a < d.address + d.bytes && d.address < a + n),
            "allocate({}) returned [{:#x}, +{}), which overlaps the block of {} bytes at {:#x} whose free waits for "
            "other streams",
            n, a, n, d.bytes, d.address);
    }
  }

  // A block freed on stream S with work pending may go to S again at once;
  // the new block then carries that work (its own free covers it), so the
  // old record is dropped. To another stream it must not go yet. A block
  // with recorded streams has one record per stream (record_free).
  void check_stream_order(std::uintptr_t a, std::size_t n, stream_t stream) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      const bool overlaps = a < it->address + it->bytes && it->address < a + n;
      if (sim_->query_event(it->done) || (overlaps && it->stream == stream)) {
        sim_->destroy_event(it->done);
        it = pending_.erase(it);
        continue;
      }
      check(!overlaps, "a block of {} bytes freed on stream {} went to stream {} before the work queued with it "
            "completed", it->bytes, it->stream, stream);
      ++it;
    }
  }

  // Ground truth for the stream-order rule: an event on the freeing stream
  // and on each stream recorded for the block, right after the free.
  void record_free(void* p, std::size_t bytes, stream_t stream, const std::vector<stream_t>& recorded) {
    if (!options_.manual_completion) return;
    const auto record_on = [&](stream_t s) {
      if (pending_.size() >= 64) {
        sim_->destroy_event(pending_.front().done);
        pending_.pop_front();
      }
      event_t e = sim_->create_event();
      sim_->record_event(e, s);
      pending_.push_back({reinterpret_cast<std::uintptr_t>(p), bytes, s, e});
    };
    record_on(stream);
    for (const stream_t s : recorded) {
      if (s != stream) record_on(s);
    }
  }

  // The model's side of a free the allocator accepted (`waiting_before`:
  // deferred() before it): the block is no longer live, and its free waits
  // exactly when the program recorded a stream for it.
  void freed(void* p, const block_model::block& b, stream_t stream, std::size_t waiting_before) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::vector<stream_t> recorded;
    if (const auto it = recorded_.find(a); it != recorded_.end()) {
      recorded = std::move(it->second);
      recorded_.erase(it);
    }
    const std::size_t waiting = stream_uses_->deferred();
    if (recorded.empty()) {
      check(waiting == waiting_before, "the free of a block of {} bytes no other stream used was deferred", b.bytes);
    } else {
      check(waiting == waiting_before + 1,
            "the free of a block of {} bytes used on {} other streams was not deferred ({} frees waited, now {})",
            b.bytes, recorded.size(), waiting_before, waiting);
      deferred_.push_back({a, b.bytes, b.rounded});
      deferred_bytes_ += b.rounded;
      ++summary_.deferred;
    }
    model_.erase(p);
    record_free(p, b.bytes, stream, recorded);
  }

  // The frees the adaptor handed back since the last call: the oldest ones,
  // as many as its count of waiting frees went down (only allocate and
  // release_cached hand any back; `where` names the call). Returns their
  // allocated bytes.
  std::size_t take_handed_back(const char* where) {
    const std::size_t waiting = stream_uses_->deferred();
    check(waiting <= deferred_.size(), "after {} {} frees wait for other streams; the program deferred only {}", where,
          waiting, deferred_.size());
    std::size_t bytes = 0;
    while (deferred_.size() > waiting) {
      bytes += deferred_.front().rounded;
      deferred_.pop_front();
    }
    deferred_bytes_ -= bytes;
    return bytes;
  }

  // Where work completes at once, every event the adaptor asks about is
  // complete, so an allocation hands back every waiting free.
  void check_deferred_handed_back(const char* what) const {
    if (options_.manual_completion) return;
    check(deferred_.empty(), "{} left {} frees waiting, though every stream's work was complete", what,
          deferred_.size());
  }

  void free_one(bool wrong_size) {
    if (model_.empty()) return;
    const auto [p, b] = model_.at(in_.below(model_.size()));
    const stream_t stream = (in_.byte() & 3) == 0 ? pick_stream() : b.stream;
    if (options_.backed) check(stamped(p, b.bytes, b.id), "block [{}, +{}) lost its data before its free", p, b.bytes);
    std::size_t size = b.bytes;
    if (wrong_size) {
      const std::array candidates = {b.bytes + 1, b.bytes * 2, std::size_t{1}, b.rounded + min_alignment,
                                     b.bytes > 1 ? b.bytes - 1 : b.bytes + 7};
      size = candidates[in_.below(candidates.size())];
    }
    const std::uint64_t mismatches = top_->stats().misuse_size_mismatch;
    const std::size_t waiting = stream_uses_->deferred();
    const free_result r = top_->try_deallocate(p, size, stream);
    if (!wrong_size) {
      check(r.status == free_status::ok, "free of a live block of {} bytes with its size was not ok", b.bytes);
    } else {
      check(r.status == free_status::ok || r.status == free_status::size_mismatch,
            "free of a live block of {} bytes with size {} was not_owned", b.bytes, size);
      if (r.status == free_status::size_mismatch) {
        check(r.bytes == b.bytes || r.bytes == b.rounded,
              "free with size {} of a block of {} (rounded {}) reported its size as {}", size, b.bytes, b.rounded,
              r.bytes);
        check(top_->stats().misuse_size_mismatch == mismatches + 1, "a size mismatch was not counted");
        ++summary_.misuse;
        ++expected_mismatches_;
        if (r.bytes != b.bytes) requested_exact_ = false;
      } else {
        // A size the policy takes as right (caching: the rounded one); the
        // statistics count the size the result names.
        check(r.bytes == b.bytes || r.bytes == b.rounded,
              "free with size {} of a block of {} (rounded {}) was ok naming {} bytes", size, b.bytes, b.rounded,
              r.bytes);
        if (r.bytes != b.bytes) requested_exact_ = false;
      }
    }
    freed(p, b, stream, waiting);
    remember_freed(p);
    ++summary_.frees;
  }

  void free_not_owned() {
    std::uintptr_t q = 0;
    int host = 0;
    switch (in_.byte() % 4) {
      case 0:  // inside a live block
        if (model_.empty()) return;
        q = inside_a_live_block();
        break;
      case 1:  // freed before (double free; the free may still wait for other streams)
        if (freed_.empty()) return;
        q = freed_[in_.below(freed_.size())];
        break;
      case 2: q = reinterpret_cast<std::uintptr_t>(&host); break;
      default: q = reinterpret_cast<std::uintptr_t>(in_.integer(8)) | 1; break;
    }
    if (q == 0 || model_.find(reinterpret_cast<void*>(q)) != nullptr) return;  // that is a live block
    const std::size_t allocated = top_->state().allocated;
    const std::uint64_t counted = top_->misuse().not_owned;
    const std::size_t waiting = stream_uses_->deferred();
    void* p = reinterpret_cast<void*>(q);
    const std::size_t bytes = 1 + in_.below(8 * MiB);
    top_->deallocate(p, bytes, pick_stream());
    check(top_->misuse().not_owned == counted + 1, "free of {} (not a live block) was not reported as not owned", p);
    check(top_->state().allocated == allocated, "free of {} (not a live block) changed allocated from {} to {}", p,
          allocated, top_->state().allocated);
    check(stream_uses_->deferred() == waiting, "free of {} (not a live block) changed the waiting frees from {} to {}",
          p, waiting, stream_uses_->deferred());
    ++expected_not_owned_;
    ++summary_.misuse;
  }

  void complete() {
    const std::uint8_t how = in_.byte();
    if (how >= 0xf8) {  // rare: see end_stream
      end_stream();
      return;
    }
    if ((how & 1) != 0) {
      sim_->complete_all();
    } else {
      sim_->complete(pick_stream());
    }
  }

  // A stream its owner destroys: stream_ending, then the sim destroys it
  // and a new stream takes its place. The blocks allocated on it belong to
  // the default stream, the uses recorded on it are gone (a block's free
  // waits for the other streams it was recorded on only), and nothing may
  // name the destroyed handle after (check_counters asks the sim). A byte of
  // 0xf8 or more where complete() reads one: the regression inputs, written
  // before this op, never give one there (so they run the programs that
  // showed their defects); five of the corpus seeds do, and now end streams.
  void end_stream() {
    const stream_t s = streams_[1 + in_.below(streams_.size() - 1)];
    try {
      top_->stream_ending(s);
    } catch (const std::exception& e) {
      throw invariant_violation(fmt::format("stream_ending({}) threw: {}", s, e.what()));
    }
    model_.move_stream(s, nullptr);
    for (auto& [p, streams] : recorded_) std::erase(streams, s);
    std::erase_if(recorded_, [](const auto& entry) { return entry.second.empty(); });
    sim_->destroy_stream(s);
    *std::find(streams_.begin(), streams_.end(), s) = sim_->create_stream();
    ++summary_.streams_ended;
  }

  void inject_fault() {
    const sim_fault_target target = fault_targets[in_.below(fault_targets.size())];
    switch (in_.byte() % 5) {
      case 0: case 1: sim_->fail_nth(target, 1 + in_.below(16)); break;
      case 2: sim_->fail_every(target, 2 + in_.below(8)); break;
      case 3: sim_->fail_from(target, 1 + in_.below(16)); break;  // pressure that stays
      default: sim_->reset_faults(); break;
    }
  }

  void release_cached() {
    try {
      top_->release_cached();
    } catch (const backend_error& e) {
      if (e.code_name() != "injected_fault") throw;  // else: what it did not reach stays cached
    }
    (void)take_handed_back("release_cached");
    check(deferred_.empty(), "release_cached left {} frees waiting for streams; it must wait for them",
          deferred_.size());
    if (options_.backed) model_.check_patterns();
  }

  // record_stream on (a) a live block, with any stream, its own included;
  // (b) a pointer where no live block starts: a freed block's address, an
  // interior pointer, host memory, any address; (c) a block whose free
  // already waits. Only (a) records; a use recorded under any other pointer
  // would show when a later block there is freed (deferred though no stream
  // was recorded for it).
  void record_use() {
    const stream_t stream = pick_stream();
    std::uintptr_t q = 0;
    int host = 0;
    switch (in_.byte() % 8) {
      case 0: case 1: case 2: case 3:
        if (model_.empty()) return;
        q = reinterpret_cast<std::uintptr_t>(model_.at(in_.below(model_.size())).first);
        break;
      case 4:
        if (freed_.empty()) return;
        q = freed_[in_.below(freed_.size())];
        break;
      case 5:
        if (model_.empty()) return;
        q = inside_a_live_block();
        break;
      case 6:
        if (deferred_.empty()) return;
        q = deferred_[in_.below(deferred_.size())].address;
        break;
      default: q = (in_.byte() & 1) != 0 ? reinterpret_cast<std::uintptr_t>(&host) : in_.integer(8); break;
    }
    void* p = reinterpret_cast<void*>(q);
    const std::size_t allocated = top_->state().allocated;
    const std::size_t waiting = stream_uses_->deferred();
    try {
      top_->record_stream(p, stream);
    } catch (const std::exception& e) {
      throw invariant_violation(fmt::format("record_stream({}) threw: {}", p, e.what()));
    }
    check(top_->state().allocated == allocated && stream_uses_->deferred() == waiting,
          "record_stream({}) changed allocated from {} to {} or the waiting frees from {} to {}", p, allocated,
          top_->state().allocated, waiting, stream_uses_->deferred());
    if (model_.find(p) == nullptr) return;
    std::vector<stream_t>& streams = recorded_[q];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }

  void edge_sizes() {
    check(top_->allocate(0, pick_stream()) == nullptr, "allocate(0) did not return nullptr");
    for (const std::size_t n : {SIZE_MAX, max_request_bytes + 1}) {
      bool invalid = false;
      try {
        (void)top_->allocate(n);
      } catch (const invalid_argument&) {
        invalid = true;
      }
      check(invalid, "allocate({}) was not invalid_argument", n);
    }
    // The largest valid request, and one byte more than the device: out of memory.
    for (const std::size_t n : {max_request_bytes, options_.capacity + 1}) {
      const bool served = allocate_one(n, pick_stream());
      check(!served, "allocate({}) succeeded on a device of {} bytes", n, options_.capacity);
    }
    check(top_->try_deallocate(nullptr, 0).status == free_status::ok, "free(nullptr) was not ok");
  }

  void burst() {
    const std::size_t n = pick_size();
    const stream_t stream = pick_stream();
    const std::size_t count = 1 + in_.below(16);
    for (std::size_t i = 0; i < count; ++i) {
      if (!allocate_one(n, stream)) break;
    }
  }

  void free_many() {
    const std::size_t keep_one_in = 1 + in_.below(4);
    std::vector<std::pair<void*, block_model::block>> victims;
    std::size_t i = 0;
    model_.for_each([&](void* p, const block_model::block& b) {
      if (i++ % keep_one_in != 0) victims.emplace_back(p, b);
    });
    for (const auto& [p, b] : victims) {
      const std::size_t waiting = stream_uses_->deferred();
      check(top_->try_deallocate(p, b.bytes, b.stream).status == free_status::ok, "free of a live block failed");
      freed(p, b, b.stream, waiting);
      remember_freed(p);
      ++summary_.frees;
    }
  }

  void remember_freed(void* p) {
    if (freed_.size() < 64) {
      freed_.push_back(reinterpret_cast<std::uintptr_t>(p));
    } else {
      freed_[summary_.frees % 64] = reinterpret_cast<std::uintptr_t>(p);
    }
  }

  // --- checks ----------------------------------------------------------------------

  void check_counters() {
    const pool_state pool = top_->state();
    check(stream_uses_->deferred() == deferred_.size(),
          "{} frees wait for other streams; the program deferred {} that were not handed back",
          stream_uses_->deferred(), deferred_.size());
    check(pool.allocated == model_.rounded() + deferred_bytes_,
          "pool allocated is {} bytes, the live blocks round to {} and the blocks whose free waits to {}",
          pool.allocated, model_.rounded(), deferred_bytes_);
    check(pool.reserved >= pool.allocated, "pool reserved {} < allocated {}", pool.reserved, pool.allocated);
    const allocator_stats s = top_->stats(pool);
    check(s.allocated.current == model_.rounded(), "statistics allocated is {}, the live blocks round to {}",
          s.allocated.current, model_.rounded());
    check(!requested_exact_ || s.requested.current == model_.requested(),
          "statistics requested is {}, the live blocks asked for {}", s.requested.current, model_.requested());
    check(s.misuse_not_owned == expected_not_owned_ && s.misuse_size_mismatch == expected_mismatches_,
          "misuse counted {} not-owned and {} size mismatches; the program did {} and {}", s.misuse_not_owned,
          s.misuse_size_mismatch, expected_not_owned_, expected_mismatches_);
    const device_allocator::misuse_counters below = stream_uses_->upstream().misuse();
    check(below.not_owned == 0 && below.size_mismatch == 0,
          "the allocator below stream_use_adaptor saw {} not-owned and {} wrong-size frees (a deferred free handed "
          "back wrongly)",
          below.not_owned, below.size_mismatch);
    check(sim_->destroyed_stream_calls() == 0, "the allocator named a stream after stream_ending ({} calls)",
          sim_->destroyed_stream_calls());
    check(s.backend_calls.held_bytes == sim_->used_bytes(), "backend held bytes {} differ from the device's {}",
          s.backend_calls.held_bytes, sim_->used_bytes());
    if (case_.expression == "arena" && case_.virtual_memory && limit_ == 0) {
      check(pool.reserved == sim_->mapped_bytes(), "arena reserved {} differs from the {} bytes the device has mapped",
            pool.reserved, sim_->mapped_bytes());
    }
  }

  void check_all() {
    check_counters();
    if (options_.backed) model_.check_patterns();
    model_.for_each([&](void* p, const block_model::block& b) {
      check(sim_->accessible(p, b.bytes), "live block [{}, +{}) is no longer accessible", p, b.bytes);
    });
    for (const memory_segment& seg : top_->memory_map().segments) {
      check(sim_->accessible(reinterpret_cast<void*>(seg.address), seg.size),
            "segment [{:#x}, +{}) of the memory map is not accessible", seg.address, seg.size);
    }
  }

  void teardown() {
    sim_->reset_faults();
    check_all();
    while (!model_.empty()) {
      const auto [p, b] = model_.at(0);
      if (options_.backed) check(stamped(p, b.bytes, b.id), "block [{}, +{}) lost its data", p, b.bytes);
      const std::size_t waiting = stream_uses_->deferred();
      check(top_->try_deallocate(p, b.bytes, b.stream).status == free_status::ok, "final free failed");
      freed(p, b, b.stream, waiting);
    }
    check_counters();
    release_cached();  // hands back every waiting free
    check_counters();
    check(top_->state().allocated == 0, "allocated is {} with no live block", top_->state().allocated);
    for (const pending_free& f : pending_) sim_->destroy_event(f.done);
    pending_.clear();
    stream_uses_ = nullptr;
    top_.reset();
    for (std::size_t i = 1; i < streams_.size(); ++i) sim_->destroy_stream(streams_[i]);
    check_device_empty(*sim_, "after the policy was destroyed");
  }

  byte_reader& in_;
  policy_case case_;
  sim_options options_;
  config cfg_;
  std::size_t limit_ = 0;
  bool construction_fault_ = false;
  sim_fault_target construction_fault_target_ = sim_fault_target::allocate;
  std::uint64_t construction_fault_nth_ = 1;

  std::unique_ptr<sim_backend> sim_;
  std::unique_ptr<statistics_adaptor> top_;
  stream_use_adaptor* stream_uses_ = nullptr;  ///< inside top_
  std::array<stream_t, 4> streams_{};
  block_model model_;
  std::map<std::uintptr_t, std::vector<stream_t>> recorded_;  ///< streams recorded per live block
  std::deque<deferred_free> deferred_;                        ///< frees that wait, oldest first
  std::size_t deferred_bytes_ = 0;                            ///< their allocated bytes
  std::deque<pending_free> pending_;
  std::vector<std::uintptr_t> freed_;
  std::uint8_t next_id_ = 1;
  std::size_t step_ = 0;
  bool requested_exact_ = true;
  std::uint64_t expected_not_owned_ = 0;
  std::uint64_t expected_mismatches_ = 0;
  sequence_summary summary_;
};

/// Runs one input through the harness; throws invariant_violation on a bug.
inline sequence_summary run_alloc_sequence(const std::uint8_t* data, std::size_t size) {
  byte_reader in(data, size);
  return alloc_sequence(in).run();
}

}  // namespace fragctl::fuzz
