"""fragctl.torch.offload_activations on the sim backend (CPU tensors stand for
device tensors): hooks move what they should, values round-trip exactly,
the budget holds, torch.utils.checkpoint composes, errors are exceptions.

    FRAGCTL_LIBRARY=build/libfragctl.so PYTHONPATH=python /usr/bin/python3 -m unittest tests/torch/test_offload.py -v
"""
import gc
import json
import os
import tempfile
import unittest
import warnings

from support import KiB, MiB, torch, SKIP

if torch is not None:
    import fragctl
    import fragctl.torch


# DeepSpeed's activation_checkpointing block (DeepSpeed, docs/_pages/
# config-json.md, "Activation Checkpointing"), as the reference writes it:
# every key at its default.
DEEPSPEED_ACTIVATION_CHECKPOINTING = """
  "activation_checkpointing": {
    "partition_activations": false,
    "cpu_checkpointing": false,
    "contiguous_memory_optimization": false,
    "number_checkpoints": null,
    "synchronize_checkpoint_boundary": false,
    "profile": false
    }
"""


def deepspeed_block(**changes):
    """DeepSpeed's activation_checkpointing block, as a ds_config dict, with `changes`."""
    config = json.loads("{" + DEEPSPEED_ACTIVATION_CHECKPOINTING + "}")
    config["activation_checkpointing"].update(changes)
    return config


def make_noting(**arguments):
    """(offload_activations(**arguments), the DeepSpeedKeyNote messages it emitted)."""
    from fragctl.torch._deepspeed import DeepSpeedKeyNote
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        offload = fragctl.torch.offload_activations(**arguments)
    return offload, [str(w.message) for w in caught if issubclass(w.category, DeepSpeedKeyNote)]


def mlp(width=256, depth=6):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def batch(width=256, rows=512):
    torch.manual_seed(1)
    return torch.randn(rows, width)  # 512 KiB per activation


def gradients(model, x, context=None, steps=1, forward=None):
    """Parameter gradients after `steps` forward/backward passes (summed)."""
    model.zero_grad(set_to_none=True)
    forward = forward or model
    for _ in range(steps):
        if context is None:
            loss = forward(x).square().mean()
            loss.backward()
        else:
            with context:
                loss = forward(x).square().mean()
                loss.backward()
    return [p.grad.clone() for p in model.parameters()]


if torch is not None:
    class Scale(torch.autograd.Function):
        """w * x, saving x for backward (x needs no gradient)."""

        @staticmethod
        def forward(ctx, w, x):
            ctx.save_for_backward(x)
            return w * x

        @staticmethod
        def backward(ctx, grad):
            x, = ctx.saved_tensors
            return grad * x, None


@unittest.skipIf(SKIP, SKIP)
class OffloadTest(unittest.TestCase):
    def assert_same(self, expected, got):
        self.assertEqual(len(expected), len(got))
        for e, g in zip(expected, got):
            self.assertTrue(torch.equal(e, g), "gradients differ: max %g" % (e - g).abs().max().item())

    def test_values_round_trip_exactly_through_the_host_tier(self):
        model, x = mlp(), batch()
        expected = gradients(model, x)
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        got = gradients(model, x, offload)
        self.assert_same(expected, got)
        s = offload.stats()
        self.assertEqual(s["backend"], "sim")
        self.assertEqual(s["device_budget"], MiB)
        self.assertLessEqual(s["device_bytes"]["peak"], MiB)
        self.assertGreater(s["copies"]["bytes_to_host"], 0)
        self.assertGreater(s["copies"]["bytes_to_device"], 0)
        # Every Linear and GELU saves its input (512 KiB), and so does square: 13 saves.
        self.assertEqual(s["tensors_moved"], 13)
        self.assertEqual(s["puts"], 13)
        self.assertEqual(s["gets"], 13)
        self.assertEqual(s["saved_alive"], 0)
        offload.close()

    def test_budget_keeps_the_last_saves_on_the_device_and_the_first_on_the_host(self):
        model, x = mlp(), batch()
        with fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim") as offload:
            loss = model(x).square().mean()
            self.assertEqual(offload.where(0), "host")
            self.assertEqual(offload.where(12), "device")
            s = offload.stats()
            self.assertEqual(s["saved_alive"], 13)
            self.assertEqual(s["device_bytes"]["current"], MiB)  # two 512 KiB saves
            self.assertEqual(s["host_bytes"]["current"], 11 * 512 * KiB)
            loss.backward()
            self.assertEqual(offload.where(0), "absent")
            self.assertEqual(offload.stats()["saved_alive"], 0)
        offload.close()

    def test_a_budget_that_holds_everything_copies_nothing_to_the_host(self):
        model, x = mlp(), batch()
        expected = gradients(model, x)
        offload = fragctl.torch.offload_activations(budget="8MiB", min_bytes="64KiB", backend="sim")
        self.assert_same(expected, gradients(model, x, offload))
        s = offload.stats()
        self.assertEqual(s["copies"]["bytes_to_host"], 0)
        self.assertEqual(s["gets_by_source"]["resident"], 13)
        offload.close()

    def test_later_steps_reuse_the_store_and_evict_one_save_ahead(self):
        model, x = mlp(), batch()
        expected = gradients(model, x, steps=3)
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        self.assert_same(expected, gradients(model, x, offload, steps=3))
        s = offload.stats()
        self.assertEqual(s["puts"], 39)
        self.assertEqual(s["iterations"], 2)  # reset at the start of steps 2 and 3
        self.assertGreater(s["copies"]["evictions_ahead"], 0)
        self.assertGreater(s["gets_by_source"]["prefetched"], 0)
        offload.close()

    def test_backward_after_the_block_unpacks_from_the_store(self):
        model, x = mlp(), batch()
        expected = gradients(model, x)
        model.zero_grad(set_to_none=True)
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        with offload:
            loss = model(x).square().mean()
        loss.backward()
        self.assert_same(expected, [p.grad for p in model.parameters()])
        self.assertEqual(offload.stats()["gets"], 13)
        offload.close()

    def test_small_tensors_and_parameters_stay(self):
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        weight = torch.nn.Parameter(torch.randn(256, 256))  # 256 KiB: above min_bytes
        leaf = torch.randn(256, 256, requires_grad=True)
        small = torch.randn(16)
        big = torch.randn(256, 256)
        with offload:
            self.assertIs(offload._pack(weight), weight)
            transposed = weight.t()
            self.assertIs(offload._pack(transposed), transposed)
            self.assertIs(offload._pack(leaf), leaf)
            self.assertIs(offload._pack(small), small)
            saved = offload._pack(big)
            self.assertIsNot(saved, big)
            back = offload._unpack(saved)
            self.assertTrue(torch.equal(back, big))
            self.assertEqual(back.shape, big.shape)
            self.assertEqual(offload.where(0), "device")
            del saved
            gc.collect()
            self.assertEqual(offload.where(0), "absent")
        s = offload.stats()
        self.assertEqual((s["tensors_moved"], s["tensors_kept"]), (1, 4))
        offload.close()

    def test_the_bench_counts_saved_tensors_on_cuda_0(self):
        # Regression (services run 1): services_bench.py measured 0 saved bytes
        # on a GPU because its filter compared a tensor's device (cuda:0) with
        # torch.device("cuda"). A stand-in tensor on cuda:0; CUDA faked present.
        import importlib.util
        import os
        import types
        from unittest import mock
        path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "services", "services_bench.py")
        spec = importlib.util.spec_from_file_location("services_bench", path)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)

        def fake(device, nbytes=2 * MiB):
            return types.SimpleNamespace(device=torch.device(device), layout=torch.strided, is_sparse=False,
                                         numel=lambda: nbytes // 2, element_size=lambda: 2, _base=None,
                                         is_leaf=False, requires_grad=True)

        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(torch.cuda, "current_device", return_value=0):
            movable = bench.movable_filter(bench.parse_args(["offload", "--out", "unused"]), fragctl.torch)
            self.assertTrue(movable(fake("cuda:0")))
            self.assertFalse(movable(fake("cuda:1")))
            self.assertFalse(movable(fake("cpu")))
            self.assertFalse(movable(fake("cuda:0", nbytes=512 * KiB)))  # below --min-bytes (1 MiB)

    def test_non_contiguous_and_other_dtypes_round_trip(self):
        offload = fragctl.torch.offload_activations(budget="4MiB", min_bytes=1, backend="sim")
        tensors = [torch.randn(300, 200).t(), torch.randn(64, 64).to(torch.bfloat16), torch.arange(1000) % 7 == 0,
                   torch.randint(-5, 5, (33, 3), dtype=torch.int64)]
        with offload:
            for t in tensors:
                back = offload._unpack(offload._pack(t))
                self.assertEqual((back.shape, back.dtype), (t.shape, t.dtype))
                self.assertTrue(torch.equal(back, t))
        offload.close()

    def test_works_with_torch_utils_checkpoint(self):
        import torch.utils.checkpoint as checkpoint
        model = mlp()
        x = batch().requires_grad_()  # reentrant checkpoint computes no gradients without one
        blocks = [model[i:i + 4] for i in range(0, len(model), 4)]

        def forward(inputs):
            h = inputs
            for i, block in enumerate(blocks):
                # Every other block recomputed in backward, the rest saved.
                h = checkpoint.checkpoint(block, h, use_reentrant=self.reentrant) if i % 2 == 0 else block(h)
            return h

        expected = gradients(model, x)
        for self.reentrant in (True, False):
            with self.subTest(use_reentrant=self.reentrant):
                offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
                self.assert_same(expected, gradients(model, x, offload, steps=1, forward=forward))
                s = offload.stats()
                self.assertGreater(s["tensors_moved"], 0)
                self.assertEqual(s["saved_alive"], 0)
                offload.close()

    def test_saves_of_a_recompute_inside_backward_stay_in_place(self):
        import torch.utils.checkpoint as checkpoint
        model = mlp()
        x = batch().requires_grad_()
        blocks = [model[i:i + 4] for i in range(0, len(model), 4)]

        def forward(inputs):
            h = inputs
            for block in blocks:
                h = checkpoint.checkpoint(block, h, use_reentrant=True)
            return h

        expected = gradients(model, x)
        # Positive control: the forward alone, which is what the store should see.
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        with offload:
            loss = forward(x).square().mean()
        forward_moved = offload.stats()["tensors_moved"]
        self.assertGreater(forward_moved, 0)
        loss.backward()
        offload.close()
        model.zero_grad(set_to_none=True)
        # Backward inside the block: its recompute saves the blocks' insides again.
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        self.assert_same(expected, gradients(model, x, offload, steps=1, forward=forward))
        s = offload.stats()
        self.assertEqual(s["tensors_moved"], forward_moved)
        self.assertGreater(s["tensors_kept_in_backward"], 0)
        self.assertEqual(s["saved_alive"], 0)
        offload.close()
        model.zero_grad(set_to_none=True)
        # keep_backward_saves=False (for create_graph=True): the recompute's saves move too.
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim",
                                                    keep_backward_saves=False)
        self.assert_same(expected, gradients(model, x, offload, steps=1, forward=forward))
        s = offload.stats()
        self.assertGreater(s["tensors_moved"], forward_moved)
        self.assertEqual(s["tensors_kept_in_backward"], 0)
        offload.close()

    def test_cpu_checkpointing_false_installs_no_hooks(self):
        model, x = mlp(), batch()
        offload = fragctl.torch.offload_activations(budget="1MiB", cpu_checkpointing=False, backend="sim")
        self.assert_same(gradients(model, x), gradients(model, x, offload))
        self.assertEqual(offload.stats(), {"tensors_moved": 0, "tensors_kept": 0, "tensors_kept_in_backward": 0,
                                           "tensors_shared": 0, "tensors_spilled": 0, "saved_alive": 0,
                                           "tensors_to_host_direct": 0, "bytes_to_host_direct": 0})

    def test_deepspeeds_activation_checkpointing_block_is_taken_with_one_note(self):
        # Issue 31: the block at DeepSpeed's defaults was refused
        # (contiguous_memory_optimization false) and config= did not exist.
        model, x = mlp(), batch()
        expected = gradients(model, x)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ds_config.json")
            with open(path, "w") as f:
                json.dump(deepspeed_block(), f)
            for config in (path, deepspeed_block(), deepspeed_block()["activation_checkpointing"]):
                offload, notes = make_noting(budget="1MiB", min_bytes="64KiB", config=config, backend="sim")
                self.assertEqual(len(notes), 1, notes)
                self.assertIn("cpu_checkpointing=false: no hooks are installed", notes[0])
                self.assertIn("contiguous_memory_optimization=false: the store keeps every device copy in its one "
                              "region", notes[0])
                self.assertEqual(len(offload.notes), 2)
                # cpu_checkpointing false, as DeepSpeed reads it: nothing offloaded.
                self.assert_same(expected, gradients(model, x, offload))
                self.assertEqual(offload.stats()["tensors_moved"], 0)
                offload.close()
        # DeepSpeed's CPU checkpointing, from the block or a keyword over it: the store takes them.
        for arguments in ({"config": deepspeed_block(cpu_checkpointing=True)},
                          {"config": deepspeed_block(), "cpu_checkpointing": True}):
            offload, notes = make_noting(budget="1MiB", min_bytes="64KiB", backend="sim", **arguments)
            self.assertEqual(len(notes), 1, notes)
            self.assertNotIn("cpu_checkpointing", notes[0])
            self.assert_same(expected, gradients(model, x, offload))
            self.assertGreater(offload.stats()["tensors_moved"], 0)
            offload.close()

    def test_number_checkpoints_is_taken_with_a_note(self):
        # Regression (issue 31): TypeError.
        offload, notes = make_noting(budget="1MiB", number_checkpoints=4, backend="sim")
        self.assertEqual(notes, ["fragctl.torch.offload_activations: DeepSpeed keys taken without DeepSpeed's effect "
                                 "(what fragctl does instead): number_checkpoints=4: the budget sizes the store's "
                                 "region"])
        self.assertTrue(offload.cpu_checkpointing)
        offload.close()
        # Without DeepSpeed keys, no note.
        self.assertEqual(make_noting(budget="1MiB", backend="sim")[1], [])

    def test_activation_values_fragctl_cannot_honour_are_named_with_the_reason_and_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ds_config.json")
            with open(path, "w") as f:
                json.dump(deepspeed_block(partition_activations=True, profile=True, cpu_checkpionting=True), f)
            with self.assertRaises(fragctl.ConfigurationError) as e:
                fragctl.torch.offload_activations(budget="1MiB", config=path, backend="sim")
            message = str(e.exception)
            for part in ("partition_activations=true (unsupported: splitting activations over model-parallel ranks",
                         "profile=true (unsupported: fragctl logs no per-checkpoint times",
                         "cpu_checkpionting (unknown)"):
                self.assertIn("the DeepSpeed config %s: %s" % (path, part), message)
            with open(path, "w") as f:
                json.dump(deepspeed_block(number_checkpoints="all"), f)
            with self.assertRaisesRegex(fragctl.ConfigurationError, "number_checkpoints=\"all\": expected a count"):
                fragctl.torch.offload_activations(budget="1MiB", config=path, backend="sim")

    def test_bad_arguments_raise(self):
        make = fragctl.torch.offload_activations
        with self.assertRaises(fragctl.ConfigurationError) as e:
            make(budget="8 apples", backend="sim")
        self.assertIn("8 apples", str(e.exception))
        self.assertIsInstance(e.exception, ValueError)
        for bad in (True, 1.5, None, [1]):
            with self.assertRaises(TypeError):
                make(budget=bad, backend="sim")
        with self.assertRaises(ValueError):
            make(budget=0, backend="sim")
        with self.assertRaises(ValueError):
            make(budget=-1, backend="sim")
        with self.assertRaises(ValueError):
            make(min_bytes="-1MiB", backend="sim")
        with self.assertRaisesRegex(ValueError, "partition_activations"):
            make(partition_activations=True, backend="sim")
        with self.assertRaisesRegex(TypeError, "evict_ahead"):
            make(evict_ahead="yes", backend="sim")
        with self.assertRaisesRegex(ValueError, "backend"):
            make(backend="tpu")
        with self.assertRaisesRegex(TypeError, "number_checkpoints must be an int >= 0 or None"):
            make(number_checkpoints="4", backend="sim")
        with self.assertRaisesRegex(TypeError, "cpu_checkpointing must be a bool"):
            make(cpu_checkpointing="yes", backend="sim")
        # Regression (issue 27): these were accepted at construction and
        # failed (or crashed) only in the first with block.
        with self.assertRaisesRegex(ValueError, "device=-3"):
            make(device=-3, backend="sim")
        with self.assertRaises(TypeError):
            make(device="cuda:0", backend="sim")
        with self.assertRaises(OverflowError):
            make(device=2 ** 40, backend="sim")
        with self.assertRaisesRegex(TypeError, "allocator must be a fragctl.Allocator, got str"):
            make(allocator="x", backend="sim")

    def test_tensors_larger_than_the_budget_go_to_the_host_instead_of_raising(self):
        # Regression (services run 1): a 64 MiB save under a 1 MiB budget raised
        # OutOfMemoryError from the forward pass while the host had room.
        model, x = mlp(), batch()
        expected = gradients(model, x)
        offload = fragctl.torch.offload_activations(budget="256KiB", min_bytes="64KiB", backend="sim")
        got = gradients(model, x, offload, steps=2)
        self.assert_same([2 * e for e in expected], got)
        s = offload.stats()
        self.assertEqual(s["tensors_moved"], 26)
        self.assertEqual(s["tensors_to_host_direct"], 26)  # every 512 KiB save, both steps
        self.assertEqual(s["bytes_to_host_direct"], 26 * 512 * KiB)
        self.assertEqual(s["puts"], 0)
        offload.close()

    def test_the_store_alignment_is_the_librarys(self):
        # Held once, in the checkpoint store (store.hpp), read through the C API.
        from fragctl import _capi
        import fragctl.torch.offload as module
        self.assertEqual(module._store_alignment(), _capi.library().fragctl_checkpoint_alignment())
        self.assertEqual(module._store_alignment(), 512)
        # A tensor larger than the budget rounded up to it can never fit: straight to the host.
        offload = fragctl.torch.offload_activations(budget=1000, min_bytes=1, backend="sim")
        x = torch.ones(256, requires_grad=True)  # 1 KiB: fits 1024 = 1000 rounded up to 512
        with offload:
            y = (x * x).sum()
        y.backward()
        self.assertEqual(offload.stats()["tensors_to_host_direct"], 0)
        offload.close()

    def test_what_fits_the_budget_still_goes_to_the_store(self):
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        fits, too_big = torch.randn(256, 256), torch.randn(1024, 512)  # 256 KiB, 2 MiB
        with offload:
            saved = [offload._pack(fits), offload._pack(too_big)]
            self.assertEqual(offload.where(0), "device")
            self.assertEqual(offload.where(1), "absent")  # never in the store
            self.assertTrue(torch.equal(offload._unpack(saved[0]), fits))
            self.assertTrue(torch.equal(offload._unpack(saved[1]), too_big))
        s = offload.stats()
        self.assertEqual((s["puts"], s["tensors_to_host_direct"], s["tensors_moved"]), (1, 1, 2))
        del saved
        gc.collect()
        offload.close()

    def test_a_tensor_autograd_saves_twice_is_moved_once(self):
        # cross_entropy's log-probabilities are saved by its log-softmax and
        # by its nll-loss: one copy into the store, not two (the services
        # run's loss head: 3.9 GiB crossed PCIe twice each way).
        torch.manual_seed(0)
        head, x, y = torch.nn.Linear(64, 512), torch.randn(2048, 64), torch.randint(0, 512, (2048,))
        expected = gradients(head, x, forward=lambda t: torch.nn.functional.cross_entropy(head(t), y).sqrt())
        for budget, puts, direct in (("16MiB", 2, 0), ("2MiB", 1, 1)):  # the 4 MiB log-probs in the store, on the host
            offload = fragctl.torch.offload_activations(budget=budget, min_bytes="64KiB", backend="sim")
            got = gradients(head, x, offload, forward=lambda t: torch.nn.functional.cross_entropy(head(t), y).sqrt())
            self.assert_same(expected, got)
            s = offload.stats()
            self.assertEqual(s["tensors_shared"], 1, budget)
            self.assertEqual((s["puts"], s["tensors_to_host_direct"], s["tensors_moved"]), (puts, direct, 2), budget)
            self.assertEqual(s["saved_alive"], 0)
            offload.close()

    def test_a_tensor_changed_in_place_between_two_saves_is_moved_again(self):
        w, values = torch.ones(100000, requires_grad=True), torch.arange(100000.0)
        x = values.clone()
        offload = fragctl.torch.offload_activations(budget="16MiB", min_bytes="64KiB", backend="sim")
        with offload:
            a = Scale.apply(w, x)
            x.add_(1)  # same memory, shape and tensor; a new version
            b = Scale.apply(w, x)
            (a.sum() + b.sum()).backward()
        self.assertTrue(torch.equal(w.grad, 2 * values + 1))  # sharing the first save would give 2 * values
        self.assertEqual((offload.stats()["tensors_shared"], offload.stats()["puts"]), (0, 2))
        offload.close()

    def test_memory_of_a_dead_tensor_saved_again_by_a_new_one_is_moved_again(self):
        # Two tensors over the same bytes at different times, each with one
        # in-place write (equal versions): only the first one's death tells them apart.
        w, memory = torch.ones(100000, requires_grad=True), bytearray(100000 * 4)
        offload = fragctl.torch.offload_activations(budget="16MiB", min_bytes="64KiB", backend="sim")
        with offload:
            first = torch.frombuffer(memory, dtype=torch.float32).fill_(1)
            a = Scale.apply(w, first)
            del first
            second = torch.frombuffer(memory, dtype=torch.float32).fill_(2)
            b = Scale.apply(w, second)
            (a.sum() + b.sum()).backward()
        self.assertTrue(torch.equal(w.grad, torch.full((100000,), 3.0)))
        self.assertEqual((offload.stats()["tensors_shared"], offload.stats()["puts"]), (0, 2))
        offload.close()

    def test_unpack_after_close_raises(self):
        model, x = mlp(), batch()
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", backend="sim")
        with offload:
            loss = model(x).square().mean()
        offload.close()
        with self.assertRaisesRegex(RuntimeError, "store was closed"):
            loss.backward()

    def test_an_allocator_under_a_live_store_refuses_to_close(self):
        # Regression (review): closing it left the store on a destroyed allocator.
        allocator = fragctl.Allocator("caching", backend="sim", sim_backed=True, sim_capacity=64 * MiB)
        model, x = mlp(), batch()
        expected = gradients(model, x)
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", allocator=allocator)
        with offload:
            loss = model(x).square().mean()
        with self.assertRaisesRegex(fragctl.FragctlError, "a checkpoint store, a ZeRO-3 manager or a block imported"):
            allocator.close()
        model.zero_grad(set_to_none=True)
        loss.backward()  # the store still works
        self.assert_same(expected, [p.grad.clone() for p in model.parameters()])
        gc.collect()
        offload.close()
        allocator.close()

    def test_a_sim_allocator_without_memory_is_refused_naming_the_option(self):
        # Regression (issue 27 H4): the store's region came from an accounting
        # sim allocator (fake addresses) and the first save crashed the process.
        accounting = fragctl.Allocator("caching", backend="sim", sim_capacity=64 * MiB)
        with self.assertRaises(fragctl.ConfigurationError) as caught:
            fragctl.torch.offload_activations(budget="1MiB", allocator=accounting)
        self.assertIn("the allocator has no memory behind the addresses", str(caught.exception))
        # The fix it names: where a GPU is present the store goes there, else to sim's host memory.
        fix = ('fragctl.Allocator(backend="cuda")' if torch.cuda.is_available() else
               'fragctl.Allocator(backend="sim", sim_backed=True)')
        self.assertIn(fix, str(caught.exception))
        # backend="sim" with an allocator of another kind is refused the same way.
        with self.assertRaises(fragctl.ConfigurationError):
            fragctl.torch.offload_activations(budget="1MiB", allocator=accounting, backend="sim")
        accounting.close()
        # The control: host memory is taken, and decides the device (CPU) without backend=.
        backed = fragctl.Allocator("caching", backend="sim", sim_backed=True, sim_capacity=64 * MiB)
        self.assertEqual(backed.memory_kind, "host")
        offload = fragctl.torch.offload_activations(budget="1MiB", min_bytes="64KiB", allocator=backed)
        model, x = mlp(), batch()
        self.assert_same(gradients(model, x), gradients(model, x, offload))
        self.assertEqual(offload.stats()["backend"], "sim")
        offload.close()
        backed.close()

    def test_gpu_and_host_memory_are_refused_for_the_other_kind_of_tensor(self):
        from fragctl.torch._interop import require_memory
        require_memory("host", torch.device("cpu"), "who")
        require_memory("device", torch.device("cuda", 0), "who")
        with self.assertRaisesRegex(fragctl.ConfigurationError, "who: the allocator has GPU memory .* so CPU tensors "
                                                                "cannot live there; pass an allocator with host memory"):
            require_memory("device", torch.device("cpu"), "who")
        with self.assertRaisesRegex(fragctl.ConfigurationError, "host memory .* so CUDA tensors cannot live there; "
                                                                "pass an allocator on the GPU"):
            require_memory("host", torch.device("cuda", 0), "who")
        with self.assertRaisesRegex(fragctl.ConfigurationError, "set FRAGCTL_BACKEND to cuda or hip"):
            require_memory("none", torch.device("cuda", 0), "who", environment=True)

    def test_a_backward_with_retain_graph_runs_twice_on_a_budget_of_the_largest_save(self):
        # Regression (issue 27): the store keeps a checkpoint it handed out
        # in the region until autograd frees the saved tensor, which
        # retain_graph=True postpones, so the second backward could not bring
        # one back from the host: OutOfMemoryError with a 512 KiB budget and
        # 512 KiB saves.
        model, x = mlp(), batch()
        expected = gradients(model, x)
        model.zero_grad(set_to_none=True)
        offload = fragctl.torch.offload_activations(budget="512KiB", min_bytes="64KiB", backend="sim")
        with offload:
            loss = model(x).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
        self.assert_same([2 * e for e in expected], [p.grad for p in model.parameters()])
        s = offload.stats()
        self.assertGreater(s["tensors_spilled"], 0)
        self.assertLessEqual(s["device_bytes"]["peak"], 512 * KiB)
        del loss
        gc.collect()
        self.assertEqual(offload.stats()["saved_alive"], 0)
        # The control: without retain_graph nothing stays pinned, nothing is spilled.
        offload2 = fragctl.torch.offload_activations(budget="512KiB", min_bytes="64KiB", backend="sim")
        self.assert_same(expected, gradients(model, x, offload2))
        self.assertEqual(offload2.stats()["tensors_spilled"], 0)
        offload.close()
        offload2.close()


if __name__ == "__main__":
    unittest.main()
