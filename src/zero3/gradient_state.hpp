// The state of a binding's gradient path (fragctl/zero3/gradient_flow.hpp
// states the semantics): per block the applications still due, the partial
// sums kept aside, the bucket and what it received, whether backward holds
// the block and whether it was reduced in this backward; per shard what its
// gradient view is bound to and what was kept aside for it; whether a
// backward has begun and whether the optimizer's step is open. The work of
// one event is a queue of tasks, run until a task needs the binding's last
// actions done first. Internal to src/zero3; the block manager owns one and
// drives the manager only through its public operations.
#pragma once

#include <cstddef>
#include <deque>
#include <span>
#include <vector>

#include "fragctl/zero3/block_manager.hpp"
#include "fragctl/zero3/gradient_flow.hpp"

namespace fragctl::zero3 {

class gradient_state {
 public:
  explicit gradient_state(block_manager& manager);

  [[nodiscard]] gradient_batch handle(gradient_event event, std::size_t block, std::size_t param, stream_t stream,
                                      std::span<const unsigned char> gradients_set, std::size_t capacity);
  /// The manager's step ended (block_manager::end_step).
  void step_ended() noexcept { step_open_ = false; }
  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  struct block_state {
    std::vector<int> uses;              // applications whose gradient is still due, per parameter
    std::vector<unsigned char> partial; // a partial sum is kept aside (slot first_slot + param)
    std::vector<unsigned char> received;
    std::vector<view> bucket;           // the bucket's views while the block holds one
    std::size_t first_slot = 0;
    std::size_t shard = none;           // the shard of its trainable slice
    bool held = false;                  // fetched for backward, not released yet
    bool reduced = false;               // reduced in this backward already
  };
  enum class bound : unsigned char { none, slice, carried };
  struct shard_state {
    std::size_t block = 0;
    std::size_t param = none;  // none: the block's trainable slice; else a persistent parameter
    std::size_t elements = 0;
    bound to = bound::none;
    void* pointer = nullptr;   // the slice it is bound to
    bool carry = false;        // kept[carry_slot]: the gradient carried into this backward
    bool again = false;        // kept[again_slot]: slice sums of earlier reduces of this backward
  };
  enum class task_kind : unsigned char { begin, arrive, settle, reduce, reduce_now, settle_done, finish, abandon_done,
                                         forward };
  struct task {
    task_kind kind;
    std::size_t block = 0;
    std::size_t param = 0;
  };

  void emit(gradient_do what, std::size_t block = 0, std::size_t param = 0) { emit({what, block, param}); }
  void emit(const gradient_action& action) { out_.push_back(action); }
  void then(task_kind kind, std::size_t block = 0, std::size_t param = 0) { spawned_.push_back({kind, block, param}); }
  void settle_all();
  void run(const task& t);
  void begin();
  void arrive(std::size_t block, std::size_t param);
  /// Copies (or adds) the gradient in hand, or the one kept at `slot`, into
  /// the bucket view; true when the block then has all its gradients.
  bool deliver(std::size_t block, std::size_t param, std::size_t slot);
  void settle(std::size_t block);
  void reduce(std::size_t block);
  void reduce_now(std::size_t block);
  void settle_done(std::size_t block);
  void finish();
  void abandon_done();
  void forward();
  [[nodiscard]] std::size_t carry_slot(std::size_t shard) const noexcept { return slots_ + shard; }
  [[nodiscard]] std::size_t again_slot(std::size_t shard) const noexcept { return slots_ + shards_.size() + shard; }
  [[nodiscard]] bool trainable(std::size_t block, std::size_t param) const;
  [[nodiscard]] bool persistent(std::size_t block, std::size_t param) const;

  block_manager& m_;
  std::vector<block_state> blocks_;
  std::vector<shard_state> shards_;
  std::size_t slots_ = 0;  // partial-sum slots, one per parameter
  bool begun_ = false;     // a backward has begun and not ended or been settled
  bool step_open_ = false; // a backward ended since the manager's last end_step
  stream_t stream_ = nullptr;
  std::vector<unsigned char> set_;  // the last gradients_set reported
  std::deque<task> tasks_;
  std::vector<task> spawned_;
  std::vector<gradient_action> out_;    // actions not handed out yet
  std::vector<gradient_action> batch_;  // the actions handed out by the last call
};

}  // namespace fragctl::zero3
