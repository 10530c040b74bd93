// The gradient path of a framework binding (fragctl/zero3/gradient_flow.hpp
// states the semantics; gradient_state.hpp the state). Each event queues
// tasks; a task runs the manager's operations and emits the binding's
// actions. A task whose manager operation must follow the actions emitted
// before it (a reduce reads the bucket the binding filled; finish_gradients
// the persistent gradients; end_step and release_gradients order after the
// binding's work; begin reads the gradients the binding reports) waits:
// the batch so far is handed out, and the binding's resume runs it.
#include <algorithm>

#include "fmt/format.h"
#include "zero3/gradient_state.hpp"
#include "zero3/manager_state.hpp"

namespace fragctl::zero3 {

gradient_state::gradient_state(block_manager& manager) : m_(manager) {
  const model_layout& l = m_.layout();
  blocks_.resize(l.blocks.size());
  for (std::size_t b = 0; b < l.blocks.size(); ++b) {
    const block_layout& bl = l.blocks[b];
    block_state& s = blocks_[b];
    const std::size_t n = bl.parameters.size();
    s.uses.assign(n, 0);
    s.partial.assign(n, 0);
    s.received.assign(n, 0);
    s.first_slot = slots_;
    slots_ += n;
    if (bl.trainable_shard_elements() > 0) {
      s.shard = shards_.size();
      shards_.push_back({.block = b, .param = none, .elements = bl.trainable_shard_elements()});
    }
    for (std::size_t i = 0; i < n; ++i) {
      const parameter_layout& p = bl.parameters[i];
      if (!p.persistent || !p.trainable) continue;
      shards_.push_back({.block = b, .param = i, .elements = p.elements, .to = bound::slice,
                         .pointer = m_.persistent_gradient(b, i).data});
    }
  }
}

bool gradient_state::trainable(std::size_t block, std::size_t param) const {
  return m_.layout().blocks[block].parameters[param].trainable;
}

bool gradient_state::persistent(std::size_t block, std::size_t param) const {
  return m_.layout().blocks[block].parameters[param].persistent;
}

gradient_batch gradient_state::handle(gradient_event event, std::size_t block, std::size_t param, stream_t stream,
                                      std::span<const unsigned char> gradients_set, std::size_t capacity) {
  if (capacity == 0) throw invalid_argument("zero3: gradient_event needs room for at least one action");
  const bool needs_set = event == gradient_event::forward || event == gradient_event::forward_in_backward;
  if (needs_set || !gradients_set.empty()) {
    if (gradients_set.size() != shards_.size()) {
      throw invalid_argument(fmt::format("zero3: gradients_set has {} entries; the manager has {} shards",
                                         gradients_set.size(), shards_.size()));
    }
    set_.assign(gradients_set.begin(), gradients_set.end());
  }
  const bool names_block = event == gradient_event::applied || event == gradient_event::unpacked ||
                           event == gradient_event::arrived;
  if (names_block && block >= blocks_.size()) throw invalid_argument(fmt::format("zero3: no block {}", block));
  stream_ = stream;
  if (event != gradient_event::resume) {  // an unfinished event's actions are dropped
    tasks_.clear();
    out_.clear();
  }
  try {
    switch (event) {
      case gradient_event::applied:
        for (std::size_t i = 0; i < blocks_[block].uses.size(); ++i) {
          if (!trainable(block, i)) continue;
          ++blocks_[block].uses[i];
          emit(gradient_do::track, block, i);
        }
        break;
      case gradient_event::unpacked:
        if (!blocks_[block].held) {
          blocks_[block].held = true;
          emit(gradient_do::fetch, block);
        }
        break;
      case gradient_event::arrived:
        if (param >= blocks_[block].uses.size() || !trainable(block, param)) {
          throw invalid_argument(fmt::format("zero3: block {} has no trainable parameter {}", block, param));
        }
        if (!begun_) {
          begun_ = true;
          set_.clear();
          emit(gradient_do::queue_end);
          emit(gradient_do::report);
          tasks_.push_back({task_kind::begin});
        }
        tasks_.push_back({task_kind::arrive, block, param});
        break;
      case gradient_event::backward_ended:
        if (begun_) {
          settle_all();
          tasks_.push_back({task_kind::finish});
        }
        break;
      case gradient_event::forward_in_backward:
        if (begun_) break;  // a checkpoint's recompute: the backward goes on
        [[fallthrough]];
      case gradient_event::forward:
        if (begun_) {  // the last backward raised: its end never came
          settle_all();
          tasks_.push_back({task_kind::abandon_done});
        }
        tasks_.push_back({task_kind::forward});
        break;
      case gradient_event::resume:
        break;
      default:
        throw invalid_argument(fmt::format("zero3: unknown gradient event {}", static_cast<int>(event)));
    }
    while (!tasks_.empty()) {
      const task t = tasks_.front();
      const bool after_actions = t.kind == task_kind::begin || t.kind == task_kind::reduce_now ||
                                 t.kind == task_kind::finish || t.kind == task_kind::forward;
      if (after_actions && !out_.empty()) break;
      tasks_.pop_front();
      spawned_.clear();
      run(t);
      tasks_.insert(tasks_.begin(), spawned_.begin(), spawned_.end());
    }
  } catch (...) {
    tasks_.clear();
    out_.clear();
    batch_.clear();
    throw;
  }
  const auto n = static_cast<std::ptrdiff_t>(std::min(capacity, out_.size()));
  batch_.assign(out_.begin(), out_.begin() + n);
  out_.erase(out_.begin(), out_.begin() + n);
  return {batch_, !out_.empty() || !tasks_.empty()};
}

void gradient_state::settle_all() {
  begun_ = false;
  for (std::size_t b = 0; b < blocks_.size(); ++b) tasks_.push_back({task_kind::settle, b});
}

void gradient_state::run(const task& t) {
  switch (t.kind) {
    case task_kind::begin: begin(); break;
    case task_kind::arrive: arrive(t.block, t.param); break;
    case task_kind::settle: settle(t.block); break;
    case task_kind::reduce: reduce(t.block); break;
    case task_kind::reduce_now: reduce_now(t.block); break;
    case task_kind::settle_done: settle_done(t.block); break;
    case task_kind::finish: finish(); break;
    case task_kind::abandon_done: abandon_done(); break;
    case task_kind::forward: forward(); break;
  }
}

// A backward begins: a shard whose gradient is set carries it (torch's
// accumulation), and every held view starts at zero (a slice this backward
// does not reduce contributes nothing beside what is carried).
void gradient_state::begin() {
  if (set_.size() != shards_.size()) {
    throw invalid_argument("zero3: a backward began without the shards' gradients (resume with gradients_set after "
                           "a report action)");
  }
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    shard_state& s = shards_[k];
    s.carry = set_[k] != 0;
    s.again = false;
    if (s.carry) emit({.what = gradient_do::carry, .block = s.block, .shard = k, .slot = carry_slot(k)});
    if (s.to != bound::none) emit({.what = gradient_do::zero_view, .block = s.block, .shard = k});
  }
}

// One application's gradient: summed aside until the parameter's last
// application reports, then delivered; the delivery that completes the
// block reduces it.
void gradient_state::arrive(std::size_t block, std::size_t param) {
  block_state& s = blocks_[block];
  const std::size_t slot = s.first_slot + param;
  if (s.uses[param] > 0) --s.uses[param];
  if (s.partial[param] != 0) {
    emit({.what = gradient_do::add_kept, .block = block, .param = param, .slot = slot});
    s.partial[param] = 0;
  }
  if (s.uses[param] > 0) {
    emit({.what = gradient_do::keep, .block = block, .param = param, .slot = slot});
    s.partial[param] = 1;
    return;
  }
  if (deliver(block, param, none)) then(task_kind::reduce, block);
}

bool gradient_state::deliver(std::size_t block, std::size_t param, std::size_t slot) {
  block_state& s = blocks_[block];
  if (s.bucket.empty()) {
    const std::span<const view> views = m_.begin_gradients(block, stream_);
    s.bucket.assign(views.begin(), views.end());
    std::fill(s.received.begin(), s.received.end(), 0);
  }
  if (slot != none) emit({.what = gradient_do::take, .block = block, .param = param, .slot = slot});
  // A persistent parameter's view is its replicated gradient: after a reduce
  // in this backward it holds that reduce's gradient, which must stay.
  const bool add = s.reduced && persistent(block, param);
  emit({.what = add ? gradient_do::bucket_add : gradient_do::bucket_copy, .block = block, .param = param,
        .pointer = s.bucket[param].data, .elements = m_.layout().blocks[block].parameters[param].elements});
  s.received[param] = 1;
  for (std::size_t i = 0; i < s.received.size(); ++i) {
    if (trainable(block, i) && s.received[i] == 0) return false;
  }
  return true;
}

// End of backward (or abandon) for one block: its partial sums delivered
// (a delivery that completes the block is reduced before the next), a
// bucket still held completed with zeros and reduced, the block released.
void gradient_state::settle(std::size_t block) {
  block_state& s = blocks_[block];
  for (std::size_t i = 0; i < s.partial.size(); ++i) {
    if (s.partial[i] == 0) continue;
    s.partial[i] = 0;
    if (deliver(block, i, s.first_slot + i)) {
      then(task_kind::reduce, block);
      then(task_kind::settle, block);
      return;
    }
  }
  std::fill(s.uses.begin(), s.uses.end(), 0);
  if (!s.bucket.empty()) {
    for (std::size_t i = 0; i < s.bucket.size(); ++i) {
      if (!trainable(block, i) || s.received[i] != 0 || (s.reduced && persistent(block, i))) continue;
      emit({.what = gradient_do::bucket_zero, .block = block, .param = i, .pointer = s.bucket[i].data,
            .elements = m_.layout().blocks[block].parameters[i].elements});
    }
    then(task_kind::reduce, block);
  }
  then(task_kind::settle_done, block);
}

// Before a second reduce of a block in one backward the host waits for the
// manager's streams (the first reduce must have landed) and the slice's sum
// so far is kept aside: the reduce-scatter overwrites the slice.
void gradient_state::reduce(std::size_t block) {
  block_state& s = blocks_[block];
  if (s.reduced) {
    m_.synchronize();
    const view g = m_.gradient_shard(block);
    if (g.data != nullptr && s.shard != none) {
      shard_state& sh = shards_[s.shard];
      emit({.what = sh.again ? gradient_do::add_slice : gradient_do::keep_slice, .block = block, .shard = s.shard,
            .slot = again_slot(s.shard), .pointer = g.data, .elements = sh.elements});
      sh.again = true;
    }
  }
  then(task_kind::reduce_now, block);
}

void gradient_state::reduce_now(std::size_t block) {
  block_state& s = blocks_[block];
  m_.reduce_gradients(block, stream_);
  s.reduced = true;
  s.bucket.clear();
  if (s.held) {
    s.held = false;
    emit(gradient_do::release, block);
  }
}

void gradient_state::settle_done(std::size_t block) {
  block_state& s = blocks_[block];
  if (s.held) {
    s.held = false;
    emit(gradient_do::release, block);
  }
  s.reduced = false;
}

// The end of a backward: persistent gradients summed, each shard's view
// bound to its slice (or to what it carried when it holds none), what was
// carried and kept aside added, and the view made the shard's gradient.
void gradient_state::finish() {
  m_.finish_gradients(stream_);
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    shard_state& s = shards_[k];
    void* slice = s.param == none ? m_.gradient_shard(s.block).data : s.pointer;
    if (slice == nullptr) {
      if (s.carry) {
        emit({.what = gradient_do::bind_kept, .block = s.block, .shard = k, .slot = carry_slot(k)});
        s.to = bound::carried;
      } else if (s.to != bound::none) {
        emit({.what = gradient_do::bind, .block = s.block, .shard = k});
        s.to = bound::none;
      }
      s.pointer = nullptr;
      if (s.again) emit({.what = gradient_do::drop, .block = s.block, .shard = k, .slot = again_slot(k)});
    } else {
      if (s.to != bound::slice || s.pointer != slice) {
        emit({.what = gradient_do::bind, .block = s.block, .shard = k, .pointer = slice, .elements = s.elements});
        s.to = bound::slice;
        s.pointer = slice;
      }
      if (s.carry) emit({.what = gradient_do::add_to_view, .block = s.block, .shard = k, .slot = carry_slot(k)});
      if (s.again) emit({.what = gradient_do::add_to_view, .block = s.block, .shard = k, .slot = again_slot(k)});
    }
    emit({.what = gradient_do::set_grad, .block = s.block, .shard = k});
    s.carry = false;
    s.again = false;
  }
  step_open_ = true;
}

// After settling a backward that raised: what it carried or kept aside is
// dropped; no gradient is summed or set.
void gradient_state::abandon_done() {
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    shard_state& s = shards_[k];
    if (s.carry) emit({.what = gradient_do::drop, .block = s.block, .shard = k, .slot = carry_slot(k)});
    if (s.again) emit({.what = gradient_do::drop, .block = s.block, .shard = k, .slot = again_slot(k)});
    s.carry = false;
    s.again = false;
  }
  step_open_ = true;
}

// A forward outside backward: the optimizer's step ends, and with no
// shard's gradient set the slices are freed (none is held in forward).
// Whether slices are held is the manager's count: a backward that raised
// after some reduces left slices no view is bound to.
void gradient_state::forward() {
  if (step_open_) m_.end_step(stream_);  // clears step_open_
  if (std::any_of(set_.begin(), set_.end(), [](unsigned char c) { return c != 0; })) return;
  if (m_.stats().gradients.current == 0) return;
  m_.release_gradients(stream_);
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    shard_state& s = shards_[k];
    if (s.param != none || s.to == bound::none) continue;
    emit({.what = gradient_do::bind, .block = s.block, .shard = k});
    s.to = bound::none;
    s.pointer = nullptr;
  }
}

// --- block_manager ------------------------------------------------------------

gradient_batch block_manager::gradient_step(gradient_event event, std::size_t block, std::size_t param,
                                            stream_t stream, std::span<const unsigned char> gradients_set,
                                            std::size_t capacity) {
  return impl_->gradients->handle(event, block, param, stream, gradients_set, capacity);
}

std::size_t block_manager::gradient_shards() const { return impl_->gradients->shard_count(); }

}  // namespace fragctl::zero3
