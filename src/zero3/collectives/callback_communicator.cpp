// make_callback_communicator: collectives run by the caller's runtime
// (torch.distributed from Python), turned into the communicator contract.
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "fmt/format.h"
#include "fragctl/zero3/communicator.hpp"

namespace fragctl::zero3 {

namespace {

class callback_communicator final : public communicator {
 public:
  explicit callback_communicator(callback_collectives c) : c_(std::move(c)) {}

  [[nodiscard]] int rank() const noexcept override { return c_.rank; }
  [[nodiscard]] int size() const noexcept override { return c_.size; }
  [[nodiscard]] std::string_view name() const noexcept override { return "callback"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return c_.timeout; }

  void all_gather(std::span<const gather_part> parts, stream_t stream, std::string_view tag) override {
    run("all_gather", tag, [&](std::string& message) { return c_.all_gather(parts, stream, tag, message); });
  }

  void reduce_scatter(std::span<const scatter_part> parts, data_type type, stream_t stream,
                      std::string_view tag) override {
    run("reduce_scatter", tag,
        [&](std::string& message) { return c_.reduce_scatter(parts, type, stream, tag, message); });
  }

  void check() override {
    if (failure_) throw *failure_;
  }
  void synchronize() override { check(); }
  void abort() noexcept override {
    if (!failure_) {
      failure_.emplace(fmt::format("zero3 rank {}: communicator aborted", c_.rank), c_.rank, "abort", "", false);
    }
  }
  [[nodiscard]] std::uint64_t blocked_ns() const noexcept override { return blocked_ns_; }

 private:
  template <class Call>
  void run(const char* operation, std::string_view tag, Call&& call) {
    check();
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    callback_result result = callback_result::failed;
    try {
      result = call(message);
    } catch (const std::exception& e) {
      message = e.what();
    }
    blocked_ns_ += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    if (result == callback_result::ok) return;
    const bool timed_out = result == callback_result::timed_out;
    failure_.emplace(fmt::format("zero3 rank {}: {} of {} {}{}{}; communicator aborted", c_.rank, operation, tag,
                                 timed_out ? fmt::format("did not complete within {} ms", c_.timeout.count())
                                           : std::string("failed"),
                                 message.empty() ? "" : ": ", message),
                     c_.rank, operation, std::string(tag), timed_out);
    throw *failure_;
  }

  callback_collectives c_;
  std::optional<collective_error> failure_;
  std::uint64_t blocked_ns_ = 0;
};

}  // namespace

std::unique_ptr<communicator> make_callback_communicator(callback_collectives c) {
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    throw invalid_argument(fmt::format("zero3: callback communicator rank {} of size {}", c.rank, c.size));
  }
  if (!c.all_gather || !c.reduce_scatter) {
    throw invalid_argument("zero3: callback communicator needs both all_gather and reduce_scatter");
  }
  return std::make_unique<callback_communicator>(std::move(c));
}

}  // namespace fragctl::zero3
