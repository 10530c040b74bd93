// Threads as ranks: the collectives of one process's threads over sim.
//
// A collective is two rendezvous. Each rank posts what it calls (operation,
// parts, type, tag) and waits until every rank has posted; the posts are
// checked against each other (a mismatch is the bug NCCL would hang on, so
// it is an error here); each rank then moves its own data, reading the peers'
// send buffers directly (backed sim memory is host memory), and waits at the
// second rendezvous so no rank overwrites a send buffer a peer still reads.
// A rendezvous that passes its deadline aborts the group; every rank waiting
// in it, or arriving later, gets a collective_error. The rank that times out
// names the ranks that have not entered the collective (or not finished it),
// each with the last collective it completed and how long ago: collectives
// are numbered per rank, and every rank calls the same ones in the same order,
// so #n is the same collective on every rank (issue 31); the hang goes into
// the process's reports too (hang_record.hpp). The data moves at once on
// the host; the collective also counts as one unit of sim work on its stream,
// so with manual completion the events after it stay pending as on a GPU.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "fragctl/sim_backend.hpp"
#include "fragctl/zero3/communicator.hpp"
#include "zero3/collectives/hang_record.hpp"
#include "zero3/collectives/host_math.hpp"

namespace fragctl::zero3 {

namespace {

enum class op_kind : std::uint8_t { all_gather, reduce_scatter };

const char* op_name(op_kind k) { return k == op_kind::all_gather ? "all_gather" : "reduce_scatter"; }

struct post {
  op_kind kind = op_kind::all_gather;
  std::vector<gather_part> gathers;
  std::vector<scatter_part> scatters;
  data_type type = data_type::uint8;
  std::string tag;
};

using clock = std::chrono::steady_clock;

// The last collective a rank completed: its number, operation and tag, and when.
struct completed_op {
  std::uint64_t number = 0;
  op_kind kind = op_kind::all_gather;
  std::string tag;
  clock::time_point at{};
};

}  // namespace

class thread_group {
 public:
  thread_group(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout), taken_(static_cast<std::size_t>(size)),
        arrived_at_(static_cast<std::size_t>(size)), posts_(static_cast<std::size_t>(size)),
        entered_(static_cast<std::size_t>(size)), completed_(static_cast<std::size_t>(size)),
        started_(clock::now()) {}

  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  void take(int rank) {
    std::lock_guard lock(mutex_);
    if (taken_[static_cast<std::size_t>(rank)]) {
      throw invalid_argument(fmt::format("zero3 threads: rank {} already has a communicator", rank));
    }
    taken_[static_cast<std::size_t>(rank)] = true;
  }

  /// Runs one collective for `rank`; `move` moves this rank's data once every
  /// rank has posted. Returns the host time spent waiting for peers.
  template <class Move>
  std::uint64_t run(int rank, post mine, Move&& move) {
    const auto started = clock::now();
    std::unique_lock lock(mutex_);
    const op_kind kind = mine.kind;
    const std::string tag = mine.tag;
    const std::uint64_t number = ++entered_[static_cast<std::size_t>(rank)];
    posts_[static_cast<std::size_t>(rank)] = std::move(mine);
    rendezvous(lock, rank, kind, tag, number, false);
    check_posts(rank);
    const std::vector<post> all = posts_;  // this collective's posts; a fast rank may post its next one
    lock.unlock();
    const auto waited = clock::now() - started;
    move(all);
    const auto second = clock::now();
    lock.lock();
    rendezvous(lock, rank, kind, tag, number, true);
    completed_[static_cast<std::size_t>(rank)] = {number, kind, tag, clock::now()};
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(waited + (clock::now() - second)).count());
  }

  void abort(const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (!aborted_) {
      aborted_ = true;
      abort_reason_ = reason;
    }
    cv_.notify_all();
  }

  void check(int rank) {
    std::lock_guard lock(mutex_);
    if (aborted_) {
      throw collective_error(fmt::format("zero3 rank {}: communicator aborted ({})", rank, abort_reason_), rank,
                             "check", "", false);
    }
  }

 private:
  // `finishing`: the second rendezvous of collective `number` (every rank
  // entered it; the missing ones have not finished moving their data).
  void rendezvous(std::unique_lock<std::mutex>& lock, int rank, op_kind kind, const std::string& tag,
                  std::uint64_t number, bool finishing) {
    const char* op = op_name(kind);
    if (aborted_) throw aborted(rank, op, tag);
    const std::uint64_t generation = generation_;
    arrived_at_[static_cast<std::size_t>(rank)] = generation + 1;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto entered = clock::now();
    const auto deadline = entered + timeout_;
    while (generation_ == generation && !aborted_) {
      if (cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
      if (generation_ != generation || aborted_) break;
      hang_record hang;
      for (int r = 0; r < size_; ++r) {
        if (arrived_at_[static_cast<std::size_t>(r)] != generation + 1) hang.missing.push_back(r);
      }
      aborted_ = true;
      abort_reason_ = fmt::format("rank {} timed out in {} #{} of {}", rank, op, number, tag);
      cv_.notify_all();
      hang.peers = where(hang.missing, kind, tag, number, finishing);
      std::string places;
      for (const std::string& line : hang.peers) {
        places += "; ";
        places += line;
      }
      hang.message = fmt::format(
          "zero3 rank {}: {} #{} of {} did not complete within {} ms: rank{} {} {} {}; "
          "communicator aborted{}",
          rank, op, number, tag, timeout_.count(), hang.missing.size() == 1 ? "" : "s", fmt::join(hang.missing, ", "),
          hang.missing.size() == 1 ? "has" : "have", finishing ? "not finished it" : "not entered it", places);
      hang.rank = rank;
      hang.size = size_;
      hang.communicator = "threads";
      hang.collective = op;
      hang.sequence = number;
      hang.block = tag;
      hang.deadline = timeout_;
      hang.elapsed_s = std::chrono::duration<double>(clock::now() - entered).count();
      lock.unlock();  // the reports take the allocators' locks
      record_hang(hang);
      throw collective_error(hang.message, rank, op, tag, true);
    }
    if (generation_ == generation) throw aborted(rank, op, tag);
  }

  // "rank 2 has not entered all_gather #4 of block 7 'layer.6'; it completed
  // #3 (reduce_scatter of block 7 'layer.6') at 0.2 s and has been silent 0.4 s"
  // for each rank of `missing` (times since the group was made).
  [[nodiscard]] std::vector<std::string> where(const std::vector<int>& missing, op_kind kind, const std::string& tag,
                                               std::uint64_t number, bool finishing) const {
    const auto now = clock::now();
    const auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
    std::vector<std::string> out;
    for (const int r : missing) {
      const completed_op& last = completed_[static_cast<std::size_t>(r)];
      peer_mark mark;
      mark.number = last.number;
      mark.silent_s = seconds(now - (last.number == 0 ? started_ : last.at));
      if (last.number != 0) {
        mark.operation = op_name(last.kind);
        mark.tag = last.tag;
        mark.completed_s = seconds(last.at - started_);
      }
      out.push_back(missing_line(r, finishing, op_name(kind), number, tag, mark));
    }
    return out;
  }

  collective_error aborted(int rank, const char* op, const std::string& tag) const {
    return collective_error(
        fmt::format("zero3 rank {}: {} of {} failed: communicator aborted ({})", rank, op, tag, abort_reason_), rank,
        op, tag, false);
  }

  // Every rank must call the same collective with the same shapes.
  void check_posts(int rank) {
    const post& first = posts_[0];
    for (std::size_t r = 1; r < posts_.size(); ++r) {
      const post& p = posts_[r];
      const bool same = p.kind == first.kind && p.type == first.type && p.gathers.size() == first.gathers.size() &&
                        p.scatters.size() == first.scatters.size() &&
                        std::equal(p.gathers.begin(), p.gathers.end(), first.gathers.begin(),
                                   [](const gather_part& a, const gather_part& b) { return a.bytes == b.bytes; }) &&
                        std::equal(p.scatters.begin(), p.scatters.end(), first.scatters.begin(),
                                   [](const scatter_part& a, const scatter_part& b) { return a.elements == b.elements; });
      if (!same) {
        aborted_ = true;
        abort_reason_ = "ranks called different collectives";
        cv_.notify_all();
        const post& mine = posts_[static_cast<std::size_t>(rank)];
        throw collective_error(fmt::format("zero3 rank {}: collective mismatch: rank 0 called {} of {}, rank {} "
                                           "called {} of {} (different operation, type or sizes)",
                                           rank, op_name(first.kind), first.tag, r, op_name(p.kind), p.tag),
                               rank, op_name(mine.kind), mine.tag, false);
      }
    }
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<bool> taken_;
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<std::uint64_t> arrived_at_;  // generation + 1 a rank last arrived for
  std::vector<post> posts_;
  std::vector<std::uint64_t> entered_;     // collectives each rank entered
  std::vector<completed_op> completed_;    // the last one each rank completed
  clock::time_point started_;
  bool aborted_ = false;
  std::string abort_reason_;
};

namespace {

class thread_communicator final : public communicator {
 public:
  thread_communicator(std::shared_ptr<thread_group> group, int rank, sim_backend& sim)
      : group_(std::move(group)), rank_(rank), sim_(sim), move_data_(sim.options().backed) {}

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return group_->size(); }
  [[nodiscard]] std::string_view name() const noexcept override { return "threads"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return group_->timeout(); }

  // Each collective binds the device, as the NCCL communicator does: sim
  // records the binding and checks its release.
  void all_gather(std::span<const gather_part> parts, stream_t stream, std::string_view tag) override {
    const device_binding bound = sim_.bind_device();
    post mine{op_kind::all_gather, {parts.begin(), parts.end()}, {}, data_type::uint8, std::string(tag)};
    blocked_ns_ += group_->run(rank_, std::move(mine), [&](const std::vector<post>& all) {
      if (!move_data_) return;
      for (std::size_t i = 0; i < parts.size(); ++i) {
        auto* recv = static_cast<unsigned char*>(parts[i].recv);
        for (std::size_t r = 0; r < all.size(); ++r) {
          unsigned char* dst = recv + r * parts[i].bytes;
          const void* src = all[r].gathers[i].send;
          if (src != dst) std::memcpy(dst, src, parts[i].bytes);
        }
      }
    });
    sim_.submit(stream);  // the collective is one unit of work on the stream
  }

  void reduce_scatter(std::span<const scatter_part> parts, data_type type, stream_t stream,
                      std::string_view tag) override {
    const device_binding bound = sim_.bind_device();
    post mine{op_kind::reduce_scatter, {}, {parts.begin(), parts.end()}, type, std::string(tag)};
    blocked_ns_ += group_->run(rank_, std::move(mine), [&](const std::vector<post>& all) {
      if (!move_data_) return;
      const std::size_t element = size_of(type);
      for (std::size_t i = 0; i < parts.size(); ++i) {
        const std::size_t bytes = parts[i].elements * element;
        const std::size_t segment = static_cast<std::size_t>(rank_) * bytes;
        std::vector<unsigned char> sum(bytes);
        std::memcpy(sum.data(), static_cast<const unsigned char*>(all[0].scatters[i].send) + segment, bytes);
        for (std::size_t r = 1; r < all.size(); ++r) {
          host_math::accumulate(sum.data(), static_cast<const unsigned char*>(all[r].scatters[i].send) + segment,
                                parts[i].elements, type);
        }
        std::memcpy(parts[i].recv, sum.data(), bytes);
      }
    });
    sim_.submit(stream);
  }

  void check() override { group_->check(rank_); }
  void synchronize() override { group_->check(rank_); }
  void abort() noexcept override {
    try {
      group_->abort(fmt::format("rank {} aborted", rank_));
    } catch (...) {  // formatting ran out of memory: nothing more to do
    }
  }
  [[nodiscard]] std::uint64_t blocked_ns() const noexcept override { return blocked_ns_; }

 private:
  std::shared_ptr<thread_group> group_;
  int rank_;
  sim_backend& sim_;
  bool move_data_;
  std::uint64_t blocked_ns_ = 0;
};

}  // namespace

std::shared_ptr<thread_group> make_thread_group(int size, std::chrono::milliseconds timeout) {
  if (size < 1) throw invalid_argument(fmt::format("zero3 threads: group size {} is not positive", size));
  if (timeout.count() <= 0) throw invalid_argument("zero3 threads: the timeout must be positive");
  return std::make_shared<thread_group>(size, timeout);
}

std::unique_ptr<communicator> make_thread_communicator(std::shared_ptr<thread_group> group, int rank,
                                                       device_backend& backend) {
  if (!group) throw invalid_argument("zero3 threads: no group");
  if (rank < 0 || rank >= group->size()) {
    throw invalid_argument(fmt::format("zero3 threads: rank {} out of range (group of {})", rank, group->size()));
  }
  auto* sim = dynamic_cast<sim_backend*>(&backend);
  if (sim == nullptr) {
    throw invalid_argument(fmt::format("zero3 threads: the thread communicator runs over sim, not {}", backend.name()));
  }
  group->take(rank);
  return std::make_unique<thread_communicator>(std::move(group), rank, *sim);
}

}  // namespace fragctl::zero3
