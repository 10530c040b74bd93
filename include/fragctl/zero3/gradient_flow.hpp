// The gradient path of a framework binding over the block manager
// (docs/zero3.md, "Gradients of a framework binding"): the decisions and the
// state of ZeRO-3's gradient semantics, in one place. A binding (PyTorch's,
// python/fragctl/torch/_gradients.py) reports events; the manager answers
// with actions, each a tensor operation the binding does as told, since the
// arithmetic (adding two gradients, copying into a bucket, dividing by the
// world size) needs the framework's kernels. The manager's own operations
// (begin_gradients, reduce_gradients, finish_gradients, release_gradients,
// end_step, synchronize) it runs itself, between batches of actions.
//
// Semantics:
//   * Application counting. Each application of a block's trainable
//     parameter in a forward with gradients (`applied`) makes one gradient
//     due; the gradients of one parameter are summed (kept aside by the
//     binding) until its last one arrives, and the parameter reaches the
//     bucket once, as the sum.
//   * Delivery and reduce. A parameter's whole gradient is copied into its
//     bucket view divided by the world size (a mean over ranks); the
//     arrival that gives a block all its trainable gradients reduces it, and
//     releases the block if backward holds it (`unpacked`).
//   * A second reduce in one backward (a checkpoint recomputing the forward
//     inside the backward). The reduce-scatter overwrites the slice, so the
//     host waits for the manager's streams and the slice's sum so far is
//     kept aside, added when backward ends; a persistent parameter's new
//     gradient is added to its bucket view, which holds the first one.
//   * Settling at the end of backward: undelivered partial sums go to their
//     buckets, a bucket with missing gradients gets zeros for them (not for a
//     persistent parameter reduced before in this backward) and is reduced,
//     blocks backward still holds are released, persistent gradients are
//     summed (finish_gradients), each shard's gradient view is bound to its
//     slice and is what the shard's `.grad` becomes.
//   * Accumulation across backwards (torch's): a shard whose `.grad` is set
//     when a backward begins has that gradient carried (a clone) and added
//     at its end; held views start the backward at zero.
//   * Abandon: a forward outside backward after a backward that raised (its
//     end never came) settles the blocks as the end would, drops what was
//     carried, sums no persistent gradient and sets no `.grad`.
//   * Gradient lifetime: a forward outside backward ends the optimizer's
//     step, then frees the gradient slices when no shard's `.grad` is set
//     and the manager holds any. A forward inside a backward that has begun
//     (a recompute) does neither.
//
// Shards are numbered as the binding lists them: per block in order, its
// trainable slice (when it has trainable partitioned elements), then each
// of its persistent trainable parameters. Slots name tensors the binding
// keeps for the manager between events; their numbers mean nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace fragctl::zero3 {

/// What a binding reports (the numbers are the C API's).
enum class gradient_event : std::uint8_t {
  applied = 0,              ///< forward with gradients applies `block` (once per fetch for the module)
  unpacked = 1,             ///< backward reads a saved parameter of `block`
  arrived = 2,              ///< the gradient of one application of parameter `param` of `block`
  backward_ended = 3,       ///< the engine's end-of-backward callback
  forward = 4,              ///< the root module's forward begins, no backward running
  forward_in_backward = 5,  ///< the root module's forward begins while a backward runs
  resume = 6,               ///< the last batch is done: the next one
};

/// What a binding does, in order. `value` is the gradient in hand: the one
/// that arrived (arrived), or the one a `take` loaded.
enum class gradient_do : std::uint8_t {
  track = 0,         ///< make parameter `param` of `block` report its gradient (answer to applied)
  fetch = 1,         ///< fetch `block` for backward (answer to unpacked); a `release` ends it
  queue_end = 2,     ///< queue the end-of-backward callback
  report = 3,        ///< pass which shards have a gradient with the next resume
  carry = 4,         ///< kept[slot] = a copy of shard `shard`'s gradient
  zero_view = 5,     ///< zero shard `shard`'s gradient view
  keep = 6,          ///< kept[slot] = value
  add_kept = 7,      ///< value = kept[slot] + value; kept[slot] is dropped
  take = 8,          ///< value = kept[slot]; kept[slot] is dropped
  drop = 9,          ///< drop kept[slot]
  bucket_copy = 10,  ///< bucket view (`pointer`, parameter `param` of `block`) = value / world size
  bucket_add = 11,   ///< bucket view += value / world size
  bucket_zero = 12,  ///< bucket view = 0
  keep_slice = 13,   ///< kept[slot] = a copy of `elements` elements at `pointer` (shard `shard`'s type)
  add_slice = 14,    ///< kept[slot] = kept[slot] + the `elements` elements at `pointer`
  release = 15,      ///< release `block` (the fetch of a `fetch`)
  bind = 16,         ///< shard `shard`'s gradient view = `elements` elements at `pointer` (none when null)
  bind_kept = 17,    ///< shard `shard`'s gradient view = kept[slot]; kept[slot] is dropped
  add_to_view = 18,  ///< shard `shard`'s gradient view += kept[slot]; kept[slot] is dropped
  set_grad = 19,     ///< shard `shard`'s gradient (`.grad`) = its gradient view
};

struct gradient_action {
  gradient_do what = gradient_do::track;
  std::size_t block = 0;
  std::size_t param = 0;
  std::size_t shard = 0;
  std::size_t slot = 0;
  void* pointer = nullptr;
  std::size_t elements = 0;
};

/// The actions to do now; when `more`, report `resume` once they are done.
struct gradient_batch {
  std::span<const gradient_action> actions;
  bool more = false;
};

}  // namespace fragctl::zero3
