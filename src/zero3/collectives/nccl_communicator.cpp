// NCCL / RCCL communicator: non-blocking, every wait with a deadline.
//
// The communicator is created non-blocking (ncclConfig_t blocking = 0), so
// no NCCL call blocks the host: a call may answer ncclInProgress, and then
// the communicator is polled (ncclCommGetAsyncError) until it is ready, up to
// the deadline, before anything else is queued on its streams, as NCCL
// requires. After each collective an event is recorded on its stream; the
// collective is pending until the event completes. A watchdog thread polls the
// pending collectives and the communicator's asynchronous error; one that
// passes its deadline, or an error, aborts the communicator (which also ends
// its kernels, so a thread blocked in a stream synchronization returns) and
// is raised by the next call as collective_error naming rank, operation and
// tag. One mutex orders the NCCL calls of the driving thread and the
// watchdog, so the abort never races a call on the same communicator. The
// unique id comes from nccl_rendezvous.hpp.
//
// Naming the missing ranks (issue 31). Collectives are numbered as queued;
// each rank's record (the newest queued, the last completed) is published by
// the watchdog to a file beside the id file (progress_files.hpp), outside the
// communicator that may hang. At a collective's deadline the rank reads the
// others' files and its error names those that have not entered it and
// where each last was; the watchdog writes the hang into the process's
// reports (hang_record.hpp) before anything else ends the process.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "fragctl/backend.hpp"
#include "fragctl/device_memory.hpp"
#include "fragctl/log.hpp"
#include "zero3/collectives/hang_record.hpp"
#include "zero3/collectives/nccl_library.hpp"
#include "zero3/collectives/nccl_rendezvous.hpp"
#include "zero3/collectives/progress_files.hpp"

namespace fragctl::zero3 {

namespace {

using clock = std::chrono::steady_clock;

std::uint64_t nanoseconds_since(clock::time_point start) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count());
}

struct failure {
  std::string message;
  std::string operation;
  std::string tag;
  bool timed_out = false;
};

struct pending_op {
  event_t event = nullptr;
  clock::time_point deadline;
  std::string operation;
  std::string tag;
  std::uint64_t number = 0;  // progress_files' number of it
  std::size_t bytes = 0;
  clock::time_point entered;
};

// The job key of the progress files: the id's first bytes, in hex.
std::string job_key(const nccl::unique_id_t& id) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += fmt::format("{:02x}", static_cast<unsigned char>(id.internal[i]));
  return out;
}

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(device_backend& backend, const nccl_options& options)
      : lib_(nccl::load(options)),
        backend_(backend),
        options_(options),
        progress_(options.unique_id_file, "", options.rank, options.size, options.timeout) {
    const nccl::unique_id_t id = obtain_unique_id(lib_, options_);
    progress_ = progress_files(options_.unique_id_file, job_key(id), options_.rank, options_.size, options_.timeout);
    const std::size_t outside_before = process_memory_outside_fragctl(backend_);
    const auto started = clock::now();
    {
      const device_binding bound = backend_.bind_device();
      nccl::config_v21700 config;
      const nccl::result_t r = lib_.comm_init_rank_config(&comm_, options_.size, id, options_.rank, &config);
      if (r != nccl::success && r != nccl::in_progress) {
        const std::string what = lib_.describe(r, comm_);
        if (comm_ != nullptr) (void)lib_.comm_abort(comm_);
        comm_ = nullptr;
        throw collective_error(fmt::format("zero3 rank {}: ncclCommInitRankConfig failed: {}", rank(), what), rank(),
                               "init", "communicator", false);
      }
    }
    wait_ready("init", "communicator", started + options_.timeout);
    blocked_ns_ += nanoseconds_since(started);
    attribute_memory_since(outside_before);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~nccl_communicator() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (hang_) record_hang(*hang_);  // not yet written by the watchdog
    std::lock_guard lock(mutex_);
    if (comm_ != nullptr) {
      try {
        const device_binding bound = backend_.bind_device();
        finalize_locked();
      } catch (const std::exception& e) {
        logger().warn("zero3 rank {}: closing the communicator: {}", rank(), e.what());
      }
    }
    for (const pending_op& p : pending_) free_events_.push_back(p.event);
    for (event_t e : free_events_) {
      try {
        backend_.destroy_event(e);
      } catch (const std::exception&) {  // device lost: nothing to free
      }
    }
    if (memory_bytes_ != 0) {
      try {
        attribute_device_memory(backend_, device_memory_use::nccl, memory_label(), 0);
      } catch (const std::exception&) {  // out of host memory: the ledger keeps a stale figure
      }
    }
  }

  [[nodiscard]] int rank() const noexcept override { return options_.rank; }
  [[nodiscard]] int size() const noexcept override { return options_.size; }
  [[nodiscard]] std::string_view name() const noexcept override { return lib_.name; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return options_.timeout; }

  void all_gather(std::span<const gather_part> parts, stream_t stream, std::string_view tag) override {
    std::size_t bytes = 0;
    for (const gather_part& p : parts) bytes += p.bytes * static_cast<std::size_t>(size());
    enqueue("all_gather", tag, bytes, stream, [&] {
      for (const gather_part& p : parts) {
        const nccl::result_t r = lib_.all_gather(p.send, p.recv, p.bytes, nccl::type_uint8, comm_, stream);
        if (r != nccl::success && r != nccl::in_progress) return r;
      }
      return nccl::success;
    });
  }

  void reduce_scatter(std::span<const scatter_part> parts, data_type type, stream_t stream,
                      std::string_view tag) override {
    std::size_t bytes = 0;
    for (const scatter_part& p : parts) bytes += p.elements * size_of(type) * static_cast<std::size_t>(size());
    enqueue("reduce_scatter", tag, bytes, stream, [&] {
      for (const scatter_part& p : parts) {
        const nccl::result_t r =
            lib_.reduce_scatter(p.send, p.recv, p.elements, nccl::type_of(type), nccl::op_sum, comm_, stream);
        if (r != nccl::success && r != nccl::in_progress) return r;
      }
      return nccl::success;
    });
  }

  void check() override {
    std::unique_lock lock(mutex_);
    poll_locked();
    record_hang_unlocked(lock);
    throw_if_failed_locked();
  }

  void synchronize() override {
    const auto started = clock::now();
    std::unique_lock lock(mutex_);
    while (true) {
      poll_locked();
      record_hang_unlocked(lock);
      throw_if_failed_locked();
      if (pending_.empty()) break;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
    blocked_ns_ += nanoseconds_since(started);
  }

  void abort() noexcept override {
    std::lock_guard lock(mutex_);
    abort_locked();
    if (!failed_) failed_ = failure{fmt::format("zero3 rank {}: communicator aborted by the caller", rank()), "abort", "", false};
  }

  [[nodiscard]] std::uint64_t blocked_ns() const noexcept override { return blocked_ns_; }

 private:
  template <class Calls>
  void enqueue(const char* op, std::string_view tag, std::size_t bytes, stream_t stream, Calls&& calls) {
    const auto started = clock::now();
    nccl::result_t r = nccl::success;
    {
      std::unique_lock lock(mutex_);
      poll_locked();
      record_hang_unlocked(lock);
      throw_if_failed_locked();
      const device_binding bound = backend_.bind_device();
      // NCCL connects and allocates its buffers lazily, at the first call.
      const std::size_t outside_before = first_call_ ? process_memory_outside_fragctl(backend_) : SIZE_MAX;
      (void)lib_.group_start();
      const nccl::result_t inner = calls();
      r = lib_.group_end();
      if (first_call_) attribute_memory_since(outside_before);
      first_call_ = false;
      if (inner != nccl::success) r = inner;
      if (r != nccl::success && r != nccl::in_progress) {
        fail_locked({fmt::format("zero3 rank {}: {} of {} failed: {}; communicator aborted", rank(), op, tag,
                                 lib_.describe(r, comm_)),
                     op, std::string(tag), false});
        throw_if_failed_locked();
      }
    }
    if (r == nccl::in_progress) wait_ready(op, tag, started + options_.timeout);
    std::lock_guard lock(mutex_);
    throw_if_failed_locked();
    event_t event = nullptr;
    if (free_events_.empty()) {
      event = backend_.create_event();
    } else {
      event = free_events_.back();
      free_events_.pop_back();
    }
    backend_.record_event(event, stream);
    const std::uint64_t number = progress_.enter(op, tag, bytes);
    const auto now = clock::now();
    pending_.push_back({event, now + options_.timeout, op, std::string(tag), number, bytes, now});
    blocked_ns_ += nanoseconds_since(started);
  }

  // Polls until the communicator has no call in progress, or fails at `deadline`.
  void wait_ready(const char* op, std::string_view tag, clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    while (true) {
      throw_if_failed_locked();
      nccl::result_t state = nccl::success;
      const nccl::result_t r = lib_.comm_get_async_error(comm_, &state);
      if (r != nccl::success) state = r;
      if (state == nccl::success) return;
      if (state != nccl::in_progress) {
        fail_locked({fmt::format("zero3 rank {}: {} of {} failed: {}; communicator aborted", rank(), op, tag,
                                 lib_.describe(state, comm_)),
                     op, std::string(tag), false});
        continue;
      }
      if (clock::now() > deadline) {
        fail_locked({fmt::format("zero3 rank {}: {} of {} did not complete within {} ms (a peer never joined?); "
                                 "communicator aborted",
                                 rank(), op, tag, options_.timeout.count()),
                     op, std::string(tag), true});
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
    }
  }

  // Retires completed collectives from the oldest on and fails the
  // communicator when the oldest pending one passed its deadline (it has the
  // earliest deadline) or NCCL reports an asynchronous error. Stops at the
  // first pending collective, so a poll costs O(1) event queries amortized.
  void poll_locked() {
    if (failed_ || comm_ == nullptr) return;
    while (!pending_.empty()) {
      pending_op& oldest = pending_.front();
      bool done = false;
      try {
        done = backend_.query_event(oldest.event);
      } catch (const std::exception& e) {
        fail_locked({fmt::format("zero3 rank {}: {} of {}: {}; communicator aborted", rank(), oldest.operation,
                                 oldest.tag, e.what()),
                     oldest.operation, oldest.tag, false});
        return;
      }
      if (!done) {
        if (clock::now() > oldest.deadline) {
          fail_locked(name_missing_locked(oldest));
          return;
        }
        break;
      }
      progress_.complete(oldest.number, oldest.operation, oldest.tag, oldest.bytes);
      free_events_.push_back(oldest.event);
      pending_.pop_front();
    }
    nccl::result_t state = nccl::success;
    const nccl::result_t r = lib_.comm_get_async_error(comm_, &state);
    if (r != nccl::success) state = r;
    if (state != nccl::success && state != nccl::in_progress) {
      const std::string what = pending_.empty() ? std::string("communicator") : pending_.front().tag;
      const std::string op = pending_.empty() ? std::string("async") : pending_.front().operation;
      fail_locked({fmt::format("zero3 rank {}: {} of {} failed: {}; communicator aborted", rank(), op, what,
                               lib_.describe(state, comm_)),
                   op, what, false});
    }
  }

  // The failure of `stuck`, past its deadline: which ranks have not entered
  // it, read from their progress files, and the hang's record for the
  // reports (written by the watchdog, outside the lock).
  failure name_missing_locked(const pending_op& stuck) {
    progress_.give_up(stuck.number);
    (void)progress_.write(progress_.record());  // the others see this rank gave up
    const collective_entry entry{stuck.number, stuck.operation, stuck.tag, stuck.bytes, 0};
    const peer_verdict peers = progress_.read_peers(entry);
    std::string message = fmt::format("zero3 rank {}: {} #{} of {} did not complete within {} ms", rank(),
                                      stuck.operation, stuck.number, stuck.tag, options_.timeout.count());
    if (!peers.missing.empty()) {
      message += fmt::format("; rank{} {} {} not entered it", peers.missing.size() == 1 ? "" : "s",
                             fmt::join(peers.missing, ", "), peers.missing.size() == 1 ? "has" : "have");
    }
    message += "; communicator aborted";
    for (const std::string& line : peers.lines) {
      message += "\n  ";
      message += line;
    }
    hang_record h;
    h.rank = rank();
    h.size = size();
    h.communicator = std::string(lib_.name);
    h.collective = stuck.operation;
    h.sequence = stuck.number;
    h.block = stuck.tag;
    h.bytes = stuck.bytes;
    h.deadline = options_.timeout;
    h.elapsed_s = std::chrono::duration<double>(clock::now() - stuck.entered).count();
    h.missing = peers.missing;
    h.peers = peers.lines;
    h.message = message;
    if (!failed_) hang_ = std::move(h);
    return {std::move(message), stuck.operation, stuck.tag, true};
  }

  // Writes a hang found by poll_locked into the reports with `lock`
  // released (the reports take the allocators' locks), before the caller
  // raises it: the process may end right after.
  void record_hang_unlocked(std::unique_lock<std::mutex>& lock) {
    std::optional<hang_record> hang = std::exchange(hang_, std::nullopt);
    if (!hang) return;
    lock.unlock();
    record_hang(*hang);
    lock.lock();
  }

  void fail_locked(failure f) {
    if (!failed_) failed_ = std::move(f);
    logger().error("{}", failed_->message);
    abort_locked();
  }

  void abort_locked() noexcept {
    if (comm_ == nullptr) return;
    try {
      const device_binding bound = backend_.bind_device();
      (void)lib_.comm_abort(comm_);
    } catch (...) {  // binding failed: the device is gone; abort without it
      (void)lib_.comm_abort(comm_);
    }
    comm_ = nullptr;
  }

  // The label this communicator's device memory is attributed under.
  [[nodiscard]] std::string memory_label() const {
    return fmt::format("zero3 {} rank {} of {} ({})", lib_.name, rank(), size(), static_cast<const void*>(this));
  }

  // Adds what the process took outside fragctl since `before`
  // (process_memory_outside_fragctl, SIZE_MAX: not measured) to the device
  // memory attributed to this communicator (docs/reports.md).
  void attribute_memory_since(std::size_t before) noexcept {
    if (before == SIZE_MAX) return;
    const std::size_t after = process_memory_outside_fragctl(backend_);
    if (after == SIZE_MAX || after <= before) return;
    memory_bytes_ += after - before;
    try {
      attribute_device_memory(backend_, device_memory_use::nccl, memory_label(), memory_bytes_);
    } catch (const std::exception& e) {
      logger().debug("zero3 rank {}: the communicator's device memory is not attributed: {}", rank(), e.what());
    }
  }

  void throw_if_failed_locked() const {
    if (failed_) throw collective_error(failed_->message, rank(), failed_->operation, failed_->tag, failed_->timed_out);
  }

  void finalize_locked() {
    if (lib_.comm_finalize != nullptr) {
      nccl::result_t r = lib_.comm_finalize(comm_);
      const auto deadline = clock::now() + options_.timeout;
      while (r == nccl::in_progress || r == nccl::success) {
        nccl::result_t state = nccl::success;
        if (lib_.comm_get_async_error(comm_, &state) != nccl::success) break;
        if (state == nccl::success) break;
        if (state != nccl::in_progress || clock::now() > deadline) {
          r = state;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (r != nccl::success && r != nccl::in_progress) {
        abort_locked();
        return;
      }
    }
    (void)lib_.comm_destroy(comm_);
    comm_ = nullptr;
  }

  void watch() {
    const auto period = std::clamp(options_.timeout / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, period, [this] { return stop_; });
      if (stop_) break;
      poll_locked();
      record_hang_unlocked(lock);
      const std::string record = progress_.due(clock::now());
      if (record.empty()) continue;
      lock.unlock();  // a file write
      (void)progress_.write(record);
      lock.lock();
    }
  }

  const nccl::library& lib_;
  device_backend& backend_;
  nccl_options options_;
  nccl::comm_t comm_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread watchdog_;
  std::deque<pending_op> pending_;
  std::vector<event_t> free_events_;
  std::optional<failure> failed_;
  std::uint64_t blocked_ns_ = 0;
  progress_files progress_;          // this rank's record; guarded by mutex_ (write() needs no lock)
  std::optional<hang_record> hang_;  // a hang the watchdog has not written into the reports yet
  bool first_call_ = true;        // no collective enqueued yet
  std::size_t memory_bytes_ = 0;  // device memory attributed to this communicator
};

}  // namespace

std::unique_ptr<communicator> make_nccl_communicator(device_backend& backend, const nccl_options& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw invalid_argument(fmt::format("zero3: rank {} of world size {} is out of range", options.rank, options.size));
  }
  if (options.timeout.count() <= 0) throw invalid_argument("zero3: the collective timeout must be positive");
  const std::string_view expected = options.library == collective_library::rccl ? "hip" : "cuda";
  if (backend.name() != expected) {
    throw invalid_argument(fmt::format("zero3: {} runs on the {} backend, not {}",
                                       options.library == collective_library::rccl ? "rccl" : "nccl", expected,
                                       backend.name()));
  }
  return std::make_unique<nccl_communicator>(backend, options);
}

}  // namespace fragctl::zero3
