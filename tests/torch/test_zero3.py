"""fragctl.torch.zero3.shard over CPU ranks (gloo, the sim backend), each
rank a process: after N steps the parameters equal the unsharded model's
trained on the whole batch (float tolerance); frozen parameters get no
gradient and stay; gradient slices are freed before each forward after
zero_grad(set_to_none=True) and kept with set_to_none=False, also after a
backward that raised part way; the full
state dict round-trips; given ``allocator=``, the manager's memory is in
that allocator from shard() to close(); a rank that stops
answering makes the others raise CollectiveTimeoutError naming the rank,
the collective and the block.

    FRAGCTL_LIBRARY=build/libfragctl.so PYTHONPATH=python /usr/bin/python3 -m unittest discover -s tests/torch -p "test_zero3.py" -v
"""
import contextlib
import datetime
import os
import pickle
import tempfile
import time
import unittest

from support import SKIP, torch

ROWS, STEPS = 16, 4
DS_CONFIG = {"train_batch_size": ROWS, "zero_optimization": {
    "stage": 3, "stage3_param_persistence_threshold": 100, "stage3_prefetch_bucket_size": 2000,
    "stage3_max_live_parameters": 1e6, "overlap_comm": True}}


class TwiceApplied(torch.nn.Module if torch is not None else object):
    """Applies `shared` twice in one forward (a shared layer)."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(16, 64)
        self.shared = torch.nn.Linear(64, 64)
        self.last = torch.nn.Linear(64, 4)

    def forward(self, x):
        gelu = torch.nn.functional.gelu
        return self.last(gelu(self.shared(gelu(self.shared(gelu(self.first(x)))))))


class Gate(torch.nn.Module if torch is not None else object):
    """One block whose forward uses its parameter `b` only when asked: w is
    partitioned, a and b (64 elements) are persistent."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64) / 8)
        self.a = torch.nn.Parameter(torch.randn(64))
        self.b = torch.nn.Parameter(torch.randn(64))

    def forward(self, h, both):
        out = (h @ self.w) * self.a
        return out + h * self.b if both else out


class Gated(torch.nn.Module if torch is not None else object):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(16, 64)
        self.gate = Gate()
        self.last = torch.nn.Linear(64, 4)

    def forward(self, x, both=True):
        return self.last(self.gate(torch.nn.functional.gelu(self.first(x)), both))


def gated_steps(model, step, parts):
    """One step's loss of the "partial recompute" mode: the first part
    without the gate's `b`, the second with it."""
    first, second = parts
    return step(model, first, False).square().mean() + step(model, second, True).square().mean()


class RaisesInForward(torch.nn.Module if torch is not None else object):
    """Owns a weight (a block) and raises after using it while `fail` is set."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(16, 4))
        self.fail = True

    def forward(self, x):
        y = x @ self.weight
        if self.fail:
            raise KeyError("raised in forward")
        return y


def make_model(kind="mlp"):
    torch.manual_seed(0)
    if kind == "raises":
        return RaisesInForward()
    if kind == "twice":
        return TwiceApplied()
    if kind == "gated":
        return Gated()
    if kind == "transformer":  # nn.MultiheadAttention reads out_proj.weight outside out_proj's forward
        return torch.nn.Sequential(torch.nn.Linear(16, 32),
                                   torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
                                   torch.nn.Linear(32, 4))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    model[2].weight.requires_grad_(False)  # frozen: gathered, no gradient
    return model


def make_data(kind="mlp"):
    g = torch.Generator().manual_seed(1)
    shape = (ROWS, 5, 16) if kind == "transformer" else (ROWS, 16)  # "twice" as "mlp"
    return [torch.randn(*shape, generator=g) for _ in range(STEPS)]


def optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def shard_error(zero3, kind, reduce_bucket_size):
    """The ValueError's message when shard() refuses `reduce_bucket_size` (None when it takes it)."""
    config = {"zero_optimization": dict(DS_CONFIG["zero_optimization"], reduce_bucket_size=reduce_bucket_size)}
    try:
        zero3.shard(make_model(kind), config=config, block_types=(torch.nn.TransformerEncoderLayer,)).close()
    except ValueError as e:
        return str(e)
    return None


def shard_padding(sharded):
    """The parameter and gradient values of this rank's block shards that no
    parameter holds (the padding), given no persistent parameters."""
    import ctypes
    lib, values = sharded._lib, []
    for b, (shard, grad) in zip([b for b in sharded._blocks if any(b.trainable)], sharded._shards):
        held = torch.zeros(shard.numel(), dtype=torch.bool)
        base, width = shard.data_ptr(), shard.element_size()
        for i, trainable in enumerate(b.trainable):
            offset, pointer, nbytes = ctypes.c_size_t(), ctypes.c_void_p(), ctypes.c_size_t()
            lib.fragctl_zero3_shard_of(sharded._z, b.index, i, ctypes.byref(offset), ctypes.byref(pointer),
                                       ctypes.byref(nbytes))
            if trainable and pointer.value:
                first = (pointer.value - base) // width
                held[first:first + nbytes.value // width] = True
        values += shard.detach()[~held].tolist() + grad[~held].tolist()
    return values


def requested_bytes(allocator):
    """The bytes `allocator` (a fragctl.Allocator) hands out now."""
    return allocator.stats()["requested_bytes"]["current"]


def worker(rank, world, directory, mode, kind="mlp"):
    """One rank (a spawned process): writes rank-<r>.pkl with what it saw."""
    import torch.distributed as dist
    import fragctl.torch.zero3 as zero3
    out = {"rank": rank}
    try:
        timeout = datetime.timedelta(seconds=60)
        dist.init_process_group("gloo", init_method="file://" + os.path.join(directory, "store"), rank=rank,
                                world_size=world, timeout=timeout)
        if mode == "bucket":
            out["bucket"] = {size: shard_error(zero3, kind, size) for size in (8191, 8192)}
        model = make_model(kind)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        if mode == "load_dtype":  # a bf16 model loads the fp32 state dict
            model = model.to(torch.bfloat16)
        originals = list(model.parameters())
        config = DS_CONFIG
        if mode == "norm":  # every parameter partitioned: the norm over shards is the whole norm
            config = {"zero_optimization": dict(DS_CONFIG["zero_optimization"], stage3_param_persistence_threshold=0)}
        allocator = None
        if mode in ("env_accounting", "env_backed"):  # the user's FRAGCTL_BACKEND=sim, with or without memory
            os.environ["FRAGCTL_BACKEND"] = "sim"
            os.environ["FRAGCTL_CONF"] = "sim_capacity:256MiB" + (",sim_backed:true" if mode == "env_backed" else "")
        if mode == "accounting_allocator":  # a sim allocator without memory behind its addresses
            import fragctl
            allocator = fragctl.Allocator("caching", backend="sim", device=0, sim_capacity="256MiB")
        if mode == "allocator":  # the manager on the caller's allocator: its bytes at each stage
            import fragctl
            allocator = fragctl.Allocator("caching", backend="sim", device=0, sim_backed=True,
                                          sim_capacity="256MiB")
            out["held"] = [requested_bytes(allocator)]
        made = [0]
        if mode == "tensors":  # every tensor made over native memory, counted
            from fragctl.torch import _collectives, _interop
            wrap = _interop.wrap

            def counted(*args):
                made[0] += 1
                return wrap(*args)
            _interop.wrap = counted
            if hasattr(_collectives, "wrap"):
                _collectives.wrap = counted
        sharded = zero3.shard(model, config=config, block_types=(torch.nn.TransformerEncoderLayer,),
                              allocator=allocator)
        out["original_parameter_bytes"] = sum(p.numel() * p.element_size() for p in originals)
        if allocator is not None:
            out["held"].append(requested_bytes(allocator))
            try:
                allocator.close()
            except Exception as e:  # noqa: BLE001 (reported to the test)
                out["close_while_sharded"] = type(e).__name__
        if mode == "raise":
            with contextlib.suppress(KeyError):
                sharded(torch.ones(2, 16))
            out["state"] = sharded.full_state_dict()  # ends the step: needs every block released
            model.fail = False
            out["output"] = sharded(torch.ones(2, 16)).detach()
        elif mode == "interrupt":  # Ctrl-C inside a collective callback
            class Interrupting:
                def __getattr__(self, name):
                    return getattr(dist, name)

                def all_gather(self, *args, **kwargs):
                    raise KeyboardInterrupt()
            sharded._collectives.dist = Interrupting()
            try:
                sharded(torch.ones(2, 16))
                out["raised"] = None
            except KeyboardInterrupt:
                out["raised"] = "KeyboardInterrupt"
        elif mode == "bucket":
            sharded.close()
        elif mode == "close":
            sharded.close()
            out["after_close"] = [p.numel() for p in sharded.parameters()]
            out["used_after_close"] = []
            for use in (lambda: sharded(torch.ones(2, 16)), sharded.stats, sharded.full_state_dict,
                        lambda: sharded.load_full_state_dict(initial)):
                try:
                    use()
                    out["used_after_close"].append(None)
                except Exception as e:  # noqa: BLE001 (reported to the test)
                    out["used_after_close"].append((type(e).__name__, str(e)))
            sharded.close()  # again: nothing
        elif mode == "load_dtype":
            sharded.load_full_state_dict(initial)
            out["reloaded"] = sharded.full_state_dict()
        else:
            opt = optimizer(sharded.parameters())
            raising = [False]
            if mode == "backward_raises":  # a hook raises once model[6], [4] and [2] are reduced
                def raise_in_backward(_grad):
                    if raising[0]:
                        raise KeyError("raised in backward")

                def hook_output(_module, _inputs, output):
                    output.register_hook(raise_in_backward)
                model[0].register_forward_hook(hook_output)
            if mode in ("lifetime", "keep", "backward_raises"):  # held in each forward and after each backward
                def probe(_module, _inputs):
                    stats = sharded.stats()
                    out.setdefault("forward", []).append(
                        (stats["gradient_bytes"]["current"], stats["allocators"]["long_lived"]["allocated"]))
                model[-1].register_forward_pre_hook(probe)
            offload = None
            if mode == "offload":  # activations to the checkpoint store, parameters to zero3
                import fragctl.torch
                offload = fragctl.torch.offload_activations(budget="8KiB", min_bytes=1, backend="sim")
            for step, x in enumerate(make_data(kind)):
                with offload if offload is not None else contextlib.nullcontext():
                    if mode == "accumulate":  # two micro-batches, one step
                        for part in x.chunk(world)[rank].chunk(2):
                            sharded(part).square().mean().backward()
                    elif mode == "recompute_partial":  # the recomputed forward leaves the gate's b without gradient
                        from torch.utils.checkpoint import checkpoint
                        parts = x.chunk(world)[rank].chunk(2)
                        gated_steps(sharded, lambda m, part, both: checkpoint(m, part.requires_grad_(), both,
                                                                               use_reentrant=True)
                                    if not both else m(part, both), parts).backward()
                    elif mode == "recompute":  # two micro-batches in one backward, the first recomputed in it
                        from torch.utils.checkpoint import checkpoint
                        first, second = x.chunk(world)[rank].chunk(2)
                        recomputed = checkpoint(sharded, first.requires_grad_(), use_reentrant=True)
                        (recomputed.square().mean() + sharded(second).square().mean()).backward()
                    else:
                        loss = sharded(x.chunk(world)[rank]).square().mean()
                        raising[0] = mode == "backward_raises" and step == 1
                        if raising[0]:  # the step is abandoned: no optimizer step
                            with contextlib.suppress(KeyError):
                                loss.backward()
                            raising[0] = False
                            out["after_raise"] = sharded.stats()["gradient_bytes"]["current"]
                            opt.zero_grad(set_to_none=True)
                            continue
                        loss.backward()
                if mode in ("lifetime", "keep", "backward_raises"):
                    stats = sharded.stats()
                    out.setdefault("backward", []).append(
                        (stats["gradient_bytes"]["current"], stats["allocators"]["long_lived"]["allocated"]))
                    out["gradient_shard_bytes"] = stats["long_lived_bytes"]["gradient_shard"]
                if mode == "norm":
                    square = torch.stack([grad.square().sum() for _, grad in sharded._shards]).sum()
                    dist.all_reduce(square)
                    out.setdefault("norms", []).append(square.sqrt().item())
                    out.setdefault("padding", []).extend(shard_padding(sharded))
                opt.step()
                opt.zero_grad(set_to_none=mode != "keep")
                out.setdefault("made", []).append(made[0])
            if offload is not None:
                out["offload"] = offload.stats()
            out["state"] = sharded.full_state_dict()
            out["stats"] = sharded.stats()
            sharded.load_full_state_dict(initial)
            out["reloaded"] = sharded.full_state_dict()
            out["shard_elements"] = sum(p.numel() for p in sharded.parameters())
            if allocator is not None:
                out["held_peak"] = allocator.stats()["requested_bytes"]["peak"]
                sharded.close()
                out["held"].append(requested_bytes(allocator))
                allocator.close()
    except Exception as e:  # noqa: BLE001 (reported to the test)
        out["error"] = {"type": type(e).__name__, "message": str(e), "rank": getattr(e, "rank", None),
                        "collective": getattr(e, "collective", None), "block": getattr(e, "block", None),
                        "is_timeout": isinstance(e, TimeoutError)}
    with open(os.path.join(directory, "rank-%d.pkl" % rank), "wb") as f:
        pickle.dump(out, f)
    os._exit(0)  # gloo's teardown after a timeout may block


HANG_TIMEOUT = datetime.timedelta(seconds=3)  # the group's timeout of the hang tests: short (CI has 2 cores)
HANG_STEP = 1  # the stopping rank stops before this step's forward (the second step)


def hang_worker(rank, world, directory, stopper, report=False):
    """One rank of a run in which rank `stopper` stops before step 2's
    forward: it sleeps past the group's timeout, then tries to go on. Writes
    rank-<r>.pkl with what it saw and ends as a training script would, by
    returning (no os._exit): every process must end by itself. With
    `report`, the manager's allocator writes the JSON report
    <directory>/report.<r>.json, and the rank keeps what it held right
    after the error (before the process's exit rewrites it)."""
    import torch.distributed as dist
    import fragctl.torch.zero3 as zero3
    out = {"rank": rank, "done": []}
    report_path = os.path.join(directory, "report.%d.json" % rank)
    try:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(directory, "store"), rank=rank,
                                world_size=world, timeout=HANG_TIMEOUT)
        allocator = None
        if report:  # as torchrun starts a rank: the report records it
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
            import fragctl
            allocator = fragctl.Allocator("caching", backend="sim", device=0, sim_backed=True,
                                          sim_capacity="256MiB", report=report_path)
        sharded = zero3.shard(make_model(), config=DS_CONFIG, allocator=allocator)
        opt = optimizer(sharded.parameters())
        for step, x in enumerate(make_data()):
            if step == HANG_STEP and rank == stopper:
                time.sleep(HANG_TIMEOUT.total_seconds() + 2)  # stops answering, then comes back too late
            out["forward_at"] = time.monotonic()
            sharded(x.chunk(world)[rank]).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["done"].append(sharded.progress()["done"][0])  # the number of its last collective
    except Exception as e:  # noqa: BLE001 (reported to the test)
        out["raised_after"] = time.monotonic() - out["forward_at"]
        out["error"] = {"type": type(e).__name__, "message": str(e), "is_timeout": isinstance(e, TimeoutError)}
        for name in ("rank", "collective", "block", "sequence", "missing", "deadline", "group_timeout"):
            out["error"][name] = getattr(e, name, None)
        if report and os.path.exists(report_path):
            with open(report_path) as f:
                out["report_at_error"] = f.read()
    with open(os.path.join(directory, "rank-%d.pkl" % rank), "wb") as f:
        pickle.dump(out, f)


def run_ranks(world, mode, wait=120, kind="mlp", target=None, args=None):
    """Runs `target` (worker) in `world` spawned processes, each with (rank,
    world, directory) + `args` ((mode, kind)); returns each rank's result
    with its process's exit code (None: it did not end within `wait` s and
    was killed)."""
    import multiprocessing
    directory = tempfile.mkdtemp(prefix="fragctl-zero3-")
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target or worker, args=(r, world, directory) + (args or (mode, kind)))
                 for r in range(world)]
    for p in processes:
        p.start()
    deadline = time.monotonic() + wait
    for p in processes:
        p.join(max(1, deadline - time.monotonic()))
    ended = [p.exitcode for p in processes]
    for p in processes:
        if p.is_alive():
            p.kill()
    results = []
    for r in range(world):
        path = os.path.join(directory, "rank-%d.pkl" % r)
        if not os.path.exists(path):
            raise AssertionError("rank %d wrote no result (exit code %s)" % (r, processes[r].exitcode))
        with open(path, "rb") as f:
            results.append(dict(pickle.load(f), exitcode=ended[r], directory=directory))
    return results


def reference_state(kind="mlp", world=2, micro_batches=1, norms=None, skip=()):
    """The unsharded model trained as `world` ranks of `micro_batches` each
    would: each step's gradient is the mean over ranks of the sum over the
    rank's micro-batches; steps numbered in `skip` are left out. Appends each
    step's gradient norm to `norms`."""
    model = make_model(kind)
    opt = optimizer([p for p in model.parameters() if p.requires_grad])
    for step, x in enumerate(make_data(kind)):
        if step in skip:
            continue
        if micro_batches == 1:
            model(x).square().mean().backward()
        else:
            for rows in x.chunk(world):
                for part in rows.chunk(micro_batches):
                    (model(part).square().mean() / world).backward()
        if norms is not None:
            norms.append(torch.stack([p.grad.square().sum() for p in model.parameters() if p.requires_grad])
                         .sum().sqrt().item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model.state_dict()


@unittest.skipIf(SKIP, SKIP)
class Zero3ShardTest(unittest.TestCase):
    def assert_rank_state(self, r, expected, exact_keys=False):
        """A rank's result: no error, and its parameters those of the unsharded model."""
        self.assertNotIn("error", r, r.get("error"))
        if exact_keys:
            self.assertEqual(set(r["state"]), set(expected))
        for name, value in expected.items():
            torch.testing.assert_close(r["state"][name], value, rtol=1e-5, atol=1e-6, msg=name)

    def check_world(self, world):
        results = run_ranks(world, "train")
        expected = reference_state()
        initial = make_model().state_dict()
        total_trainable = sum(p.numel() for p in make_model().parameters() if p.requires_grad)
        shard_elements = 0
        for r in results:
            self.assert_rank_state(r, expected, exact_keys=True)
            for name in expected:
                self.assertTrue(torch.equal(r["reloaded"][name], initial[name]), name)
            self.assertTrue(torch.equal(r["state"]["2.weight"], initial["2.weight"]))  # frozen
            stats = r["stats"]
            self.assertEqual(stats["world_size"], world)
            self.assertEqual(stats["parameters"]["frozen"], 1)
            self.assertEqual(stats["parameters"]["persistent"], 4)  # the biases (below 100 elements)
            self.assertGreater(stats["reduce_scatters"], 0)
            # Regression (services run 1): the model's own parameters stayed
            # allocated beside the shards (1.75 GiB more on the H100).
            self.assertEqual(r["original_parameter_bytes"], 0)
            shard_elements += r["shard_elements"]
        # The weights' shards partition them (padding aside); biases are whole on every rank.
        biases = 64 + 64 + 64 + 4
        self.assertGreaterEqual(shard_elements - world * biases, total_trainable - biases)

    def test_two_ranks_equal_the_unsharded_model(self):
        self.check_world(2)

    def test_four_ranks_equal_the_unsharded_model(self):
        self.check_world(4)

    def test_steady_steps_make_no_tensor_over_the_managers_memory(self):
        # Issue 31 (zero3 at FSDP2's speed): every fetch made a tensor per
        # parameter through __cuda_array_interface__, every gradient one
        # over its bucket and every collective two (on a GPU each a Python
        # object, its parse and a driver query); made once per address now.
        for kind in ("mlp", "transformer"):
            results = run_ranks(2, "tensors", kind=kind)
            expected = reference_state(kind)
            for r in results:
                self.assert_rank_state(r, expected)
                made = r["made"]
                self.assertEqual(len(made), STEPS)
                self.assertGreater(made[0], 0)  # the first step makes them
                self.assertEqual(made[-1], made[1], (kind, made))  # none after the second

    def test_the_manager_allocates_from_the_allocator_given_to_shard(self):
        results = run_ranks(2, "allocator")
        expected = reference_state()
        for r in results:
            self.assert_rank_state(r, expected, exact_keys=True)
            stats = r["stats"]
            long_lived = stats["long_lived_bytes"]["shard"] + stats["long_lived_bytes"]["persistent"]
            before, at_shard, after_close = r["held"]
            self.assertEqual(before, 0)
            self.assertGreaterEqual(at_shard, long_lived)  # shards and persistent parameters
            # Gathered blocks and gradients came from it too.
            self.assertGreaterEqual(r["held_peak"], at_shard + stats["gathered_bytes"]["peak"])
            self.assertEqual(stats["allocators"]["long_lived"], stats["allocators"]["gathered"])  # one pool
            self.assertEqual(after_close, 0)
            self.assertEqual(r["close_while_sharded"], "TooLateError")

    def test_offload_activations_composes_with_shard(self):
        results = run_ranks(2, "offload")
        expected = reference_state()
        for r in results:
            self.assert_rank_state(r, expected)
            moved = r["offload"]
            self.assertGreater(moved["tensors_moved"], 0)
            self.assertGreater(moved["copies"]["bytes_to_host"], 0)
            self.assertEqual(moved["saved_alive"], 0)

    def test_shard_padding_stays_zero_and_the_norm_over_shards_is_the_models(self):
        # Regression (review): a reduce bucket's padding kept another block's
        # gradients, which the reduce-scatter summed into the gradient shards.
        results = run_ranks(2, "norm")
        expected_norms = []
        expected = reference_state(norms=expected_norms)
        for r in results:
            self.assert_rank_state(r, expected)
            self.assertGreater(len(r["padding"]), 0)  # the layout pads (2 ranks x 512 bytes)
            self.assertEqual(set(r["padding"]), {0.0})
            torch.testing.assert_close(torch.tensor(r["norms"]), torch.tensor(expected_norms), rtol=1e-5, atol=0)

    def test_gradients_are_freed_before_forward_after_zero_grad(self):
        # Regression (issue 20, one-GPU peak): the gradient shard was
        # allocated from shard() on, so every forward held it.
        results = run_ranks(2, "lifetime")
        expected = reference_state()
        for r in results:
            self.assert_rank_state(r, expected)
            slices = r["gradient_shard_bytes"]
            self.assertGreater(slices, 0)
            self.assertEqual(len(r["forward"]), len(make_data()))
            # After each backward every slice is held; in every forward none
            # is, and the long-lived allocator holds at least the slices less.
            for (grad_now, _), (grad_fwd, long_fwd), (_, long_bwd) in zip(r["backward"], r["forward"][1:],
                                                                          r["backward"]):
                self.assertEqual(grad_now, slices)
                self.assertEqual(grad_fwd, 0)
                self.assertLessEqual(long_fwd, long_bwd - slices)
            self.assertEqual(r["forward"][0][0], 0)  # none before the first backward either

    def test_gradients_kept_by_zero_grad_without_set_to_none_stay_allocated(self):
        results = run_ranks(2, "keep")
        expected = reference_state()
        for r in results:
            self.assert_rank_state(r, expected)
            slices = r["gradient_shard_bytes"]
            self.assertEqual([grad for grad, _ in r["forward"][1:]], [slices] * (len(make_data()) - 1))

    def test_a_backward_that_raised_after_some_reduces_leaves_no_gradient_held(self):
        # Regression (review of issue 20): whether slices were held was read
        # from the .grad views, which a backward that raised never set, so
        # the slices it reduced were never freed.
        results = run_ranks(2, "backward_raises")
        expected = reference_state(skip=(1,))
        for r in results:
            self.assert_rank_state(r, expected)
            slices = r["gradient_shard_bytes"]
            self.assertGreater(r["after_raise"], 0)  # the raise left the reduced blocks' slices
            self.assertLess(r["after_raise"], slices)
            self.assertEqual([grad for grad, _ in r["forward"]], [0] * len(make_data()))
            self.assertEqual([grad for grad, _ in r["backward"]], [slices] * (len(make_data()) - 1))

    def test_block_types_gather_a_layer_whose_code_reads_its_submodules_parameters(self):
        results = run_ranks(2, "train", kind="transformer")
        expected = reference_state("transformer")
        for r in results:
            self.assert_rank_state(r, expected, exact_keys=True)
            self.assertEqual(r["stats"]["blocks"], 3)  # Linear, the whole encoder layer, Linear

    def test_a_layer_applied_twice_gets_both_applications_gradients(self):
        # Regression (review): the second application's gradient overwrote the first's.
        results = run_ranks(2, "train", kind="twice")
        expected = reference_state("twice")
        for r in results:
            self.assert_rank_state(r, expected)

    def test_gradients_accumulate_over_micro_batches_until_the_step(self):
        # Regression (review): each backward overwrote the last one's gradient.
        results = run_ranks(2, "accumulate")
        expected = reference_state(world=2, micro_batches=2)
        for r in results:
            self.assert_rank_state(r, expected)

    def test_a_whole_forward_recomputed_inside_backward_keeps_the_gradients_reduced_before_it(self):
        # Two micro-batches under reentrant checkpoints, one backward: the
        # second recompute enters the root forward after the first one's
        # gradients were reduced; taken for a new step it would drop them.
        results = run_ranks(2, "recompute")
        expected = reference_state(world=2, micro_batches=2)
        for r in results:
            self.assert_rank_state(r, expected)

    def test_a_second_reduce_at_the_end_of_backward_keeps_the_first(self):
        # Regression (review of the above): when the recomputed forward left a
        # parameter of a block reduced before without gradient, the block's
        # second reduce ran at the end of backward, which had forgotten the
        # first (overwriting the slice) and zeroed the persistent b's gradient.
        results = run_ranks(2, "recompute_partial", kind="gated")
        model = make_model("gated")
        opt = optimizer(model.parameters())
        for x in make_data("gated"):
            for rows in x.chunk(2):
                (gated_steps(model, lambda m, part, both: m(part, both), rows.chunk(2)) / 2).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for r in results:
            self.assert_rank_state(r, model.state_dict())

    def test_an_exception_in_forward_releases_the_blocks_it_held(self):
        # Regression (review): the block stayed held and the hooks installed.
        results = run_ranks(2, "raise", kind="raises")
        for r in results:
            self.assertNotIn("error", r, r.get("error"))
            self.assertTrue(torch.equal(r["state"]["weight"], torch.ones(16, 4)))
            self.assertTrue(torch.equal(r["output"], torch.full((2, 4), 16.0)))

    def test_a_keyboard_interrupt_in_a_collective_reaches_the_caller(self):
        # Regression (review): the callback returned OK to C and forward went on.
        for r in run_ranks(2, "interrupt"):
            self.assertNotIn("error", r, r.get("error"))
            self.assertEqual(r["raised"], "KeyboardInterrupt")

    def test_close_empties_the_shards(self):
        # Regression (review): after close() the shards still pointed at freed memory.
        for r in run_ranks(2, "close"):
            self.assertNotIn("error", r, r.get("error"))
            self.assertEqual(r["after_close"], [])
            # Regression (issue 27): calling the module after close() gave
            # torch's raw matrix shape error; each use names the closed module.
            self.assertEqual(len(r["used_after_close"]), 4)
            for used in r["used_after_close"]:
                self.assertIsNotNone(used)
                self.assertEqual(used[0], "Zero3Error", used)
                self.assertIn("the ShardedModule is closed", used[1])

    def test_a_sim_allocator_without_memory_is_refused_naming_the_option(self):
        # Regression (issue 27 H4): shard() wrote the parameters through the
        # fake addresses of an accounting sim allocator and every rank died
        # of SIGSEGV (run_ranks then finds no result).
        for r in run_ranks(2, "accounting_allocator"):
            error = r.get("error")
            self.assertIsNotNone(error, "shard() took an allocator without memory")
            self.assertEqual(error["type"], "ConfigurationError", error)
            self.assertIn("the allocator has no memory behind the addresses", error["message"])
            self.assertIn('fragctl.Allocator(backend="sim", sim_backed=True)', error["message"])

    def test_fragctl_backend_sim_without_sim_backed_is_refused_naming_the_option(self):
        # Regression (issue 27 H4): with FRAGCTL_BACKEND=sim in the
        # environment the manager's own allocators had no memory; ranks died.
        for r in run_ranks(2, "env_accounting"):
            error = r.get("error")
            self.assertIsNotNone(error, "shard() ran the manager on allocators without memory")
            self.assertEqual(error["type"], "ConfigurationError", error)
            self.assertIn("FRAGCTL_BACKEND=sim", error["message"])
            self.assertIn("add sim_backed:true to FRAGCTL_CONF", error["message"])
        # The control: the same environment with sim_backed:true trains.
        expected = reference_state()
        for r in run_ranks(2, "env_backed"):
            self.assert_rank_state(r, expected, exact_keys=True)

    def test_load_full_state_dict_converts_to_the_parameters_dtype(self):
        # Regression (review): fp32 bytes were copied raw into bf16 shards.
        results = run_ranks(2, "load_dtype")
        initial = make_model().state_dict()
        for r in results:
            self.assertNotIn("error", r, r.get("error"))
            for name, value in initial.items():
                self.assertEqual(r["reloaded"][name].dtype, torch.bfloat16, name)
                self.assertTrue(torch.equal(r["reloaded"][name], value.to(torch.bfloat16)), name)

    def test_reduce_bucket_size_counts_a_block_types_whole_layer(self):
        # Regression (review): the check summed each module's own parameters,
        # so an encoder layer (a block_types block) reducing 8192 elements
        # passed a bucket of 8191 (its largest submodule reduces 3072).
        [r] = run_ranks(1, "bucket", kind="transformer")
        self.assertNotIn("error", r, r.get("error"))
        self.assertIsNone(r["bucket"][8192])
        self.assertIn("block 1 has 8192 trainable elements to reduce-scatter", r["bucket"][8191] or "")

    def assert_names_the_stopped_rank(self, r, stopper, others):
        """Rank r's error after rank `stopper` stopped before step 2's
        forward: a CollectiveTimeoutError within the group's timeout plus 2 s
        naming the stopped rank, the collective, the block and the deadline
        in force; the ranks in `others` are reported as waiting too."""
        import fragctl.torch.zero3 as zero3
        error = r.get("error")
        self.assertIsNotNone(error, "rank %d finished without an error" % r["rank"])
        self.assertEqual(error["type"], "CollectiveTimeoutError", error)
        self.assertTrue(error["is_timeout"])
        # The collective: the first of step 2, the all-gather of the first block.
        sequence = r["done"][HANG_STEP - 1] + 1
        what = "all_gather #%d of block 0 '0'" % sequence
        self.assertEqual((error["rank"], error["collective"], error["block"], error["sequence"]),
                         (r["rank"], "all_gather", "block 0 '0'", sequence))
        self.assertEqual(error["missing"], [stopper])
        message = error["message"]
        self.assertIn("zero3 rank %d: %s did not complete" % (r["rank"], what), message)
        self.assertIn("rank %d has not entered it" % stopper, message)
        # Where the stopped rank last was: the last collective of step 1, as every rank.
        self.assertRegex(message, r"rank %d has not entered %s; it completed #%d \(reduce_scatter|all_gather"
                         % (stopper, what, sequence - 1))
        self.assertRegex(message, r"and has been silent [0-9.]+ s \(its process last published [0-9.]+ s ago\)")
        for other in others:  # waiting, or already past its own deadline
            self.assertRegex(message, "rank %d (is in %s too|gave up on %s)" % (other, what, what))
        self.assertIn("block 0 '0': module 0;", message)  # the block's modules
        # The numbers in force, and only those.
        group = HANG_TIMEOUT.total_seconds()
        self.assertEqual(error["group_timeout"], group)
        self.assertEqual(error["deadline"], zero3.DEADLINE_FRACTION * group)
        self.assertIn("fragctl's deadline of %g s (%g x the process group's timeout of %g s)"
                      % (error["deadline"], zero3.DEADLINE_FRACTION, group), message)
        self.assertNotIn("600000", message)
        self.assertGreaterEqual(r["raised_after"], error["deadline"])
        self.assertLessEqual(r["raised_after"], group + 2)

    def test_a_rank_that_stops_is_named_by_the_rank_that_waits(self):
        # Issue 31: rank 0's error named rank 0 itself, quoted 600000 ms for
        # a 4 s group timeout and said nothing of the rank that was missing.
        results = run_ranks(2, None, wait=30, target=hang_worker, args=(1,))
        self.assert_names_the_stopped_rank(results[0], stopper=1, others=())
        # The rank that came back too late fails too, learning that rank 0 gave up.
        late = results[1]
        self.assertIsNotNone(late.get("error"), "the late rank finished without an error")
        self.assertIn("rank 0 gave up on all_gather #%d of block 0 '0'" % (late["done"][HANG_STEP - 1] + 1),
                      late["error"]["message"])
        self.assertEqual([r["exitcode"] for r in results], [0, 0])  # every process ended by itself

    def test_with_three_ranks_only_the_rank_that_stopped_is_named(self):
        # The control: the ranks that wait are reported as waiting, not missing.
        results = run_ranks(3, None, wait=40, target=hang_worker, args=(1,))
        self.assert_names_the_stopped_rank(results[0], stopper=1, others=(2,))
        self.assert_names_the_stopped_rank(results[2], stopper=1, others=(0,))
        self.assertEqual([r["exitcode"] for r in results], [0, 0, 0])

    def test_the_hang_is_in_each_ranks_report_and_fragctl_report_shows_it(self):
        # Issue 31: the error named the missing rank, but the rank's fragctl
        # report (FRAGCTL_REPORT, here the allocator's report= option) had
        # no trace of the hang, and the process was about to end.
        import json
        import subprocess
        import sys
        results = run_ranks(2, None, wait=30, target=hang_worker, args=(1, True))
        self.assert_names_the_stopped_rank(results[0], stopper=1, others=())
        directory = results[0]["directory"]
        sequence = results[0]["error"]["sequence"]
        for r in results:
            # Written when the error was raised, not only at exit.
            self.assertIn("report_at_error", r, "rank %d: no report when its error was raised" % r["rank"])
            self.assertIn('"hangs"', r["report_at_error"])
            with open(os.path.join(directory, "report.%d.json" % r["rank"])) as f:
                document = json.load(f)
            [hang] = document["hangs"]
            self.assertEqual((hang["rank"], hang["collective"], hang["sequence"], hang["block"], hang["modules"]),
                             (r["rank"], "all_gather", sequence, "block 0 '0'", ["0"]))
            self.assertEqual(hang["communicator"], "torch.distributed gloo")
            self.assertEqual(hang["group_timeout_s"], HANG_TIMEOUT.total_seconds())
            self.assertEqual(hang["message"], r["error"]["message"])
        with open(os.path.join(directory, "report.0.json")) as f:
            hang0 = json.load(f)["hangs"][0]
        self.assertTrue(hang0["timed_out"])
        self.assertEqual(hang0["missing"], [1])
        self.assertGreaterEqual(hang0["elapsed_s"], hang0["deadline_s"])
        self.assertTrue(any(line.startswith("rank 1 has not entered all_gather #%d" % sequence)
                            for line in hang0["peers"]), hang0["peers"])
        # fragctl report: one rank's report shows the hang and where rank 1 was ...
        command = [sys.executable, "-m", "fragctl", "report"]
        text = subprocess.run(command + [os.path.join(directory, "report.0.json")], capture_output=True, text=True,
                              check=True).stdout
        self.assertIn("Hangs: 1", text)
        self.assertIn("rank 0: all_gather #%d of block 0 '0' (torch.distributed gloo) passed fragctl's deadline of "
                      "%g s" % (sequence, hang0["deadline_s"]), text)
        self.assertIn("rank 1 had not entered it", text)
        self.assertIn("    rank 1 has not entered all_gather #%d of block 0 '0'" % sequence, text)
        self.assertIn("    modules: 0;", text)
        # ... and both side by side give a line per rank under the table.
        table = subprocess.run(command + [os.path.join(directory, "report.%d.json" % r) for r in (0, 1)],
                               capture_output=True, text=True, check=True).stdout
        self.assertIn("Hangs (collectives that passed their deadline or failed", table)
        self.assertIn("  rank 0: all_gather #%d of block 0 '0'" % sequence, table)
        self.assertIn("  rank 1: all_gather #%d of block 0 '0'" % sequence, table)


@unittest.skipIf(SKIP, SKIP)
@unittest.skipIf(SKIP, SKIP)
class Zero3BucketCopyTest(unittest.TestCase):
    def test_the_bucket_copy_rounds_as_a_copy_then_a_division(self):
        # Issue 31: a gradient goes into its reduce bucket divided by the
        # world size in one kernel, where it took a copy and an in-place
        # division; the bucket must hold the same bits.
        from fragctl.torch._gradients import GradientFlow

        class Flow:
            _torch = torch
        g = torch.Generator().manual_seed(3)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for world in (2, 3, 7):
                value = (torch.randn(257, 33, generator=g) * 1e3).to(dtype)
                Flow.world_size = world
                fused = torch.full_like(value, float("nan"))
                GradientFlow._bucket_copy(Flow(), fused, value)
                stepwise = torch.empty_like(value).copy_(value).div_(world)
                bits = torch.int32 if dtype == torch.float32 else torch.int16  # the same bits, not only values
                self.assertTrue(torch.equal(fused.view(bits), stepwise.view(bits)), (dtype, world))


class Zero3ArgumentsTest(unittest.TestCase):
    def test_shard_needs_torch_distributed(self):
        import torch.distributed as dist
        import fragctl.torch.zero3 as zero3
        if dist.is_initialized():
            self.skipTest("a process group exists in this process")
        with self.assertRaisesRegex(RuntimeError, "init_process_group"):
            zero3.shard(make_model())

    def test_shard_takes_only_a_fragctl_allocator(self):
        import fragctl.torch.zero3 as zero3
        with self.assertRaisesRegex(TypeError, "allocator must be a fragctl.Allocator, got str"):
            zero3.shard(make_model(), allocator="arena")

    def test_timeout_sets_the_deadline_below_the_groups_timeout(self):
        # Regression (issue 31): timeout= (600 s by default) was only quoted
        # in messages while the group's timeout was what expired.
        from types import SimpleNamespace
        import fragctl.torch.zero3 as zero3
        from fragctl.torch import _errors
        group_seconds = 4.0
        group = SimpleNamespace(options=SimpleNamespace(_timeout=datetime.timedelta(seconds=group_seconds)))
        dist = SimpleNamespace()
        self.assertEqual(zero3._deadline(dist, group, None), (zero3.DEADLINE_FRACTION * group_seconds, group_seconds))
        self.assertEqual(zero3._deadline(dist, group, group_seconds / 2), (group_seconds / 2, group_seconds))
        for bad in (group_seconds, 2 * group_seconds):
            with self.assertRaisesRegex(ValueError, "timeout=%g s is not below the process group's timeout of %g s"
                                        % (bad, group_seconds)):
                zero3._deadline(dist, group, bad)
        for bad in (0, -1.0, float("nan"), True, "3"):
            with self.assertRaises(ValueError):
                zero3._deadline(dist, group, bad)
        # The message quotes the deadline in force and where it comes from.
        progress = SimpleNamespace(deadline=group_seconds / 2, group_timeout=group_seconds, explicit=True)
        self.assertEqual(_errors._deadline_text(progress), "fragctl's deadline of %g s (shard()'s timeout=; the "
                         "process group's timeout of %g s)" % (group_seconds / 2, group_seconds))

    def test_an_allocator_on_another_gpu_than_the_model_is_refused(self):
        import fragctl
        from fragctl.torch import _pools
        with fragctl.Allocator("caching", backend="sim", device=1, sim_backed=True) as allocator:
            with self.assertRaisesRegex(ValueError, "the allocator is on sim device 1, the model on cuda:0"):
                _pools.require_device(allocator, torch.device("cuda", 0), "test")
            _pools.require_device(allocator, torch.device("cuda", 1), "test")
            _pools.require_device(allocator, torch.device("cpu"), "test")

    def test_the_manager_shares_pytorchs_allocator_while_enable_is_active(self):
        from types import SimpleNamespace
        from unittest import mock
        import fragctl.torch
        from fragctl.torch import _pools
        given = SimpleNamespace(memory_kind="device")
        private = _pools.zero3_private(torch.device("cpu"), 1 << 20)
        with mock.patch.object(fragctl.torch, "_enabled", "arena"), \
                mock.patch.object(_pools, "default_allocator",
                                  lambda device: SimpleNamespace(device=device, memory_kind="device")):
            pools = _pools.open_pools(torch, torch.device("cuda", 1), "test", None, private, roles=2)
            self.assertEqual((pools.long_lived.device, pools.owned), (1, []))
            self.assertIs(pools.transient, pools.long_lived)  # one pool
            pools = _pools.open_pools(torch, torch.device("cuda", 1), "test", given, private, roles=2)
            self.assertIs(pools.long_lived, given)
            self.assertIs(pools.transient, given)
            pools = _pools.open_pools(torch, torch.device("cpu"), "test", None, private, roles=2)
            self.assertEqual(len(pools.owned), 2)  # the manager's own: two private allocators
            self.assertEqual(pools.owned, [pools.long_lived, pools.transient])
            pools.close()
        self.assertIsNone(fragctl.torch.enabled())
        self.assertFalse(_pools.enabled_on(torch.device("cuda", 0)))  # not enabled: private allocators

if __name__ == "__main__":
    unittest.main()
