"""fragctl.torch.zero3.parse_config: DeepSpeed stage-3 options, a
zero_optimization block or a whole ds_config.json, turned into the block
manager's options; every unknown or unsupported key refused by name. Needs
no PyTorch.

    PYTHONPATH=python python3 -m unittest tests/python/test_zero3_config.py -v
"""
import copy
import json
import os
import tempfile
import unittest
import warnings

from fragctl.torch import zero3

# Hugging Face's "ZeRO-3 Example" (transformers, docs/source/en/main_classes/
# deepspeed.md: "a full ZeRO-3 auto-configuration file ds_config_zero3.json"),
# as the page writes it.
HF_ZERO3_EXAMPLE = """
{
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1
    },

    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": "auto",
            "betas": "auto",
            "eps": "auto",
            "weight_decay": "auto"
        }
    },

    "scheduler": {
        "type": "WarmupLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto"
        }
    },

    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {
            "device": "cpu",
            "pin_memory": true
        },
        "offload_param": {
            "device": "cpu",
            "pin_memory": true
        },
        "overlap_comm": true,
        "contiguous_gradients": true,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": true
    },

    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
}
"""

# DeepSpeed's ZeRO-3 example (DeepSpeed, docs/_tutorials/zero.md, "Offloading
# to CPU and NVMe with ZeRO-Infinity"), as the tutorial writes it.
DEEPSPEED_ZERO3_EXAMPLE = """
{
    "zero_optimization": {
        "stage": 3,
        "contiguous_gradients": true,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_prefetch_bucket_size": 1e7,
        "stage3_param_persistence_threshold": 1e5,
        "reduce_bucket_size": 1e7,
        "sub_group_size": 1e9,
        "offload_optimizer": {
            "device": "cpu"
         },
        "offload_param": {
            "device": "cpu"
       }
   }
}
"""


def parse_noting(config, **options):
    """(parse_config's result, the DeepSpeedKeyNote messages it emitted)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = zero3.parse_config(config, **options)
    return result, [str(w.message) for w in caught if issubclass(w.category, zero3.DeepSpeedKeyNote)]


def no_offload(config):
    """`config` with both offload blocks asking for none (Hugging Face's page:
    "If you don't want to offload to CPU memory, use none instead of cpu")."""
    config = copy.deepcopy(config)
    for key in ("offload_optimizer", "offload_param"):
        config["zero_optimization"][key]["device"] = "none"
    return config


class ParseConfigTest(unittest.TestCase):
    def test_defaults_are_deepspeeds(self):
        c = zero3.parse_config()
        self.assertEqual((c.stage3_max_live_parameters, c.stage3_prefetch_bucket_size,
                          c.stage3_param_persistence_threshold, c.reduce_bucket_size),
                         (1_000_000_000, 50_000_000, 100_000, 500_000_000))

    def test_keywords_block_and_file_agree(self):
        block = {"stage": 3, "stage3_max_live_parameters": 3e8, "stage3_prefetch_bucket_size": 2e7,
                 "stage3_param_persistence_threshold": 1000, "reduce_bucket_size": "auto", "overlap_comm": True,
                 "contiguous_gradients": True}
        expected = zero3.Zero3Config(stage3_max_live_parameters=300_000_000, stage3_prefetch_bucket_size=20_000_000,
                                     stage3_param_persistence_threshold=1000)
        self.assertEqual(zero3.parse_config(block), expected)
        ds_config = {"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": block}
        self.assertEqual(zero3.parse_config(ds_config), expected)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ds_config.json")
            with open(path, "w") as f:
                json.dump(ds_config, f)
            self.assertEqual(zero3.parse_config(path), expected)
        keywords = {k: v for k, v in block.items() if k != "reduce_bucket_size"}
        self.assertEqual(zero3.parse_config(**keywords), expected)
        # Keywords override the file's block.
        self.assertEqual(zero3.parse_config(ds_config, stage3_param_persistence_threshold=7)
                         .stage3_param_persistence_threshold, 7)

    def test_options_string_is_the_block_managers(self):
        c = zero3.parse_config(stage3_max_live_parameters=1e6, stage3_prefetch_bucket_size=5e5,
                               stage3_param_persistence_threshold=10)
        self.assertEqual(c.options_string(element_bytes=4, gradient_type="fp32"),
                         "element_bytes:4,stage3_max_live_parameters:1000000,stage3_prefetch_bucket_size:500000,"
                         "stage3_param_persistence_threshold:10,gradient_type:fp32")
        with self.assertRaises(ValueError):
            c.options_string(element_bytes=3)
        with self.assertRaises(ValueError):
            c.options_string(gradient_type="fp8")

    def test_unknown_and_unsupported_keys_are_named_together(self):
        with self.assertRaises(ValueError) as e:
            zero3.parse_config({"stage": 3, "offload_param": {"device": "cpu"}, "zero_quantized_weights": True,
                                "stage3_max_live_paramters": 1e9, "overlap_comm": "yes"})
        message = str(e.exception)
        for part in ('offload_param={"device": "cpu"} (unsupported: parameters are not offloaded',
                     "zero_quantized_weights=true (unsupported: ZeRO++ quantized weights",
                     "stage3_max_live_paramters (unknown)", 'overlap_comm="yes" (expected true, false or "auto")'):
            self.assertIn(part, message)
        self.assertIn("Accepted: stage (3), stage3_max_live_parameters", message)

    def test_hugging_faces_stock_config_without_offload_is_taken(self):
        stock = {"zero_optimization": {"stage": 3, "offload_param": {"device": "none", "pin_memory": True},
                                       "offload_optimizer": {"device": "none"}}}
        self.assertEqual(zero3.parse_config(stock), zero3.parse_config())
        with self.assertRaisesRegex(ValueError, "offload_optimizer"):
            zero3.parse_config({"stage": 3, "offload_optimizer": {"device": "nvme"}})

    def test_bad_values(self):
        with self.assertRaisesRegex(ValueError, "stage=2"):
            zero3.parse_config(stage=2)
        with self.assertRaisesRegex(ValueError, "whole number"):
            zero3.parse_config(stage3_max_live_parameters=1.5)
        with self.assertRaisesRegex(ValueError, "negative"):
            zero3.parse_config(stage3_prefetch_bucket_size=-1)
        with self.assertRaises(TypeError):
            zero3.parse_config(stage3_prefetch_bucket_size="lots")
        with self.assertRaises(TypeError):
            zero3.parse_config(stage3_prefetch_bucket_size=True)
        with self.assertRaises(TypeError):
            zero3.parse_config(["stage", 3])
        with self.assertRaises(TypeError):
            zero3.parse_config({"zero_optimization": 3})
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "cannot read"):
                zero3.parse_config(os.path.join(d, "missing.json"))
            bad = os.path.join(d, "bad.json")
            with open(bad, "w") as f:
                f.write("{not json")
            with self.assertRaisesRegex(ValueError, "not JSON"):
                zero3.parse_config(bad)

    def test_counts_beyond_any_device_are_refused_naming_the_key(self):
        # Regression (issue 27): 2**64 and 1e300 were taken as counts.
        import fragctl
        for value in (2 ** 64, 1e300, (1 << 59) + 1):
            with self.assertRaises(fragctl.ConfigurationError) as e:
                zero3.parse_config(stage3_max_live_parameters=value)
            self.assertIn("stage3_max_live_parameters=%r" % (value,), str(e.exception))
            self.assertIn("at most 2**59", str(e.exception))
            self.assertIsInstance(e.exception, ValueError)
        # The control: the largest count is taken, and so is DeepSpeed's usual form.
        self.assertEqual(zero3.MAX_COUNT, 1 << 59)
        self.assertEqual(zero3.parse_config(stage3_max_live_parameters=1 << 59).stage3_max_live_parameters, 1 << 59)
        self.assertEqual(zero3.parse_config(reduce_bucket_size=5e8).reduce_bucket_size, 500_000_000)

    def test_bad_files_are_configuration_errors_naming_the_file(self):
        # Regression (issue 27): a non-UTF-8 file, a deeply nested one and
        # one holding a list gave a raw UnicodeDecodeError, RecursionError and
        # TypeError that named no file; a bad count in a file named no file.
        import fragctl
        with tempfile.TemporaryDirectory() as d:
            cases = {
                "latin1.json": (b'{"stage": 3, "caf\xe9": 1}', "is not UTF-8 text"),
                "deep.json": (b"[" * 100000 + b"]" * 100000, "nests deeper than"),
                "list.json": (b"[1, 2]", "holds a JSON list, not an object"),
                "block.json": (b'{"zero_optimization": 3}', "zero_optimization must be an object, got int"),
                "count.json": (b'{"stage3_max_live_parameters": "lots"}',
                               "stage3_max_live_parameters='lots': expected an element count"),
                "huge.json": (b'{"zero_optimization": {"reduce_bucket_size": 1e300}}', "reduce_bucket_size=1e+300"),
                "unknown.json": (b'{"stage3_max_live_paramters": 1}', "stage3_max_live_paramters (unknown)"),
                "stage.json": (b'{"stage": 2}', "stage=2"),
                "nested_value.json": (b'{"overlap_comm": ' + b"[" * 900 + b"]" * 900 + b"}", "overlap_comm="),
                # Red team: a raw ValueError naming no file; and no bound on the read.
                "digits.json": (b'{"reduce_bucket_size": ' + b"9" * 5000 + b"}", "is not a JSON ds_config"),
                "large.json": (b'{"x": "' + b"a" * (17 << 20) + b'"}', "is larger than 16 Mi characters"),
            }
            for name, (content, expected) in cases.items():
                path = os.path.join(d, name)
                with open(path, "wb") as f:
                    f.write(content)
                with self.assertRaises(fragctl.ConfigurationError, msg=name) as e:
                    zero3.parse_config(path)
                self.assertIn(path, str(e.exception), name)
                self.assertIn(expected, str(e.exception), name)
            # A keyword's bad value is the keyword's, not the file's.
            with self.assertRaises(TypeError):
                zero3.parse_config(os.path.join(d, "stage.json"), stage=3, reduce_bucket_size="lots")
            # The control: the same file with a good value is read.
            good = os.path.join(d, "good.json")
            with open(good, "w") as f:
                f.write('{"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8}}')
            self.assertEqual(zero3.parse_config(good).reduce_bucket_size, 500_000_000)


class StockConfigTest(unittest.TestCase):
    """Issue 31: the stage-3 configs of Hugging Face's and DeepSpeed's docs."""

    def assert_offload_alone_refused(self, config):
        import fragctl
        with self.assertRaises(fragctl.ConfigurationError) as e:
            zero3.parse_config(config)
        message = str(e.exception)
        refused = message[:message.index(". Accepted")]
        self.assertIn('offload_optimizer={"device": "cpu"', refused)
        self.assertIn("optimizer state is not offloaded", refused)
        self.assertIn('offload_param={"device": "cpu"', refused)
        self.assertIn("parameters are not offloaded to CPU or NVMe", refused)
        for taken in ("sub_group_size", "stage3_max_reuse_distance", "overlap_comm", "contiguous_gradients"):
            self.assertNotIn(taken, refused)  # only what asks for something fragctl cannot do

    def assert_one_note_for_deepspeeds_internals(self, config, notes):
        self.assertEqual(len(notes), 1, notes)
        self.assertIn("sub_group_size=1e9: the torch.optim optimizer steps each rank's shards itself", notes[0])
        self.assertIn("stage3_max_reuse_distance=1e9: a block is freed by its last consumer", notes[0])
        self.assertEqual(len(config.notes), 2)
        for line in config.notes:
            self.assertIn(line, notes[0])

    def test_hugging_faces_zero3_example_is_refused_for_its_offload_alone(self):
        # Regression (issue 31): sub_group_size and stage3_max_reuse_distance
        # were refused beside the offload.
        self.assert_offload_alone_refused(json.loads(HF_ZERO3_EXAMPLE))

    def test_hugging_faces_zero3_example_without_offload_is_taken_with_one_note(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ds_config_zero3.json")
            with open(path, "w") as f:
                json.dump(no_offload(json.loads(HF_ZERO3_EXAMPLE)), f)
            config, notes = parse_noting(path)
        # "auto" takes DeepSpeed's defaults; stage3_max_live_parameters is the file's.
        defaults = zero3.parse_config({})
        self.assertEqual(config, zero3.Zero3Config(stage3_max_live_parameters=int(1e9),
                                                   stage3_prefetch_bucket_size=defaults.stage3_prefetch_bucket_size,
                                                   stage3_param_persistence_threshold=(
                                                       defaults.stage3_param_persistence_threshold),
                                                   reduce_bucket_size=defaults.reduce_bucket_size))
        self.assert_one_note_for_deepspeeds_internals(config, notes)

    def test_deepspeeds_zero3_example_is_refused_for_its_offload_alone(self):
        self.assert_offload_alone_refused(json.loads(DEEPSPEED_ZERO3_EXAMPLE))

    def test_deepspeeds_zero3_example_without_offload_is_taken_with_one_note(self):
        example = json.loads(DEEPSPEED_ZERO3_EXAMPLE)
        config, notes = parse_noting(no_offload(example))
        block = example["zero_optimization"]
        self.assertEqual(config, zero3.Zero3Config(
            **{key: int(block[key]) for key in ("stage3_max_live_parameters", "stage3_prefetch_bucket_size",
                                                "stage3_param_persistence_threshold", "reduce_bucket_size")}))
        self.assert_one_note_for_deepspeeds_internals(config, notes)

    def test_deepspeed_defaults_and_stage_1_2_keys_are_taken_with_one_note(self):
        # DeepSpeed's documented default overlap_comm=false, and the ZeRO-2
        # keys Hugging Face says DeepSpeed ignores at stage 3.
        config, notes = parse_noting({"stage": 3, "overlap_comm": False, "allgather_partitions": True,
                                      "allgather_bucket_size": 5e8, "reduce_scatter": True,
                                      "round_robin_gradients": True, "zero_quantized_weights": False,
                                      "zero_hpz_partition_size": 1, "mics_shard_size": -1})
        self.assertEqual(config, zero3.parse_config())
        self.assertEqual(len(notes), 1, notes)
        self.assertEqual(len(config.notes), 4, config.notes)  # not reduce_scatter=true, nor the capability keys
        self.assertIn("overlap_comm=false: collectives always run on the manager's communication stream", notes[0])
        for key in ("allgather_partitions=true", "allgather_bucket_size=5e8", "round_robin_gradients=true"):
            self.assertIn(key + ": a stage 1-2 key, which DeepSpeed ignores at stage 3", notes[0])
        # A config with nothing to say says nothing.
        self.assertEqual(parse_noting({"stage": 3, "overlap_comm": True})[1], [])

    def test_values_fragctl_cannot_honour_are_each_named_with_the_reason(self):
        with self.assertRaises(ValueError) as e:
            zero3.parse_config({"stage": 3, "zero_hpz_partition_size": 8, "zero_quantized_gradients": True,
                                "mics_shard_size": 8, "offload_param": {"device": "nvme"}, "sub_group_size": 1e9})
        message = str(e.exception)
        for part in ("zero_hpz_partition_size=8 (unsupported: ZeRO++ hierarchical partitioning",
                     "zero_quantized_gradients=true (unsupported: ZeRO++ quantized gradients",
                     "mics_shard_size=8 (unsupported: MiCS is not implemented",
                     'offload_param={"device": "nvme"} (unsupported: parameters are not offloaded'):
            self.assertIn(part, message)
        self.assertNotIn("sub_group_size", message[:message.index(". Accepted")])


class StatusTest(unittest.TestCase):
    def test_status_constants_are_the_librarys(self):
        # One vocabulary for every C function, the zero3 ones included: the
        # numbers are fragctl.h's enum (the ABI); the names come from the library.
        from fragctl import _capi
        for name in ("INVALID_ARGUMENT", "OUT_OF_MEMORY", "BACKEND", "STATE", "INTERNAL", "BUDGET", "COLLECTIVE",
                     "TIMEOUT"):
            self.assertEqual(_capi.status_name(getattr(_capi, name)), "FRAGCTL_ERROR_" + name)
        self.assertEqual(_capi.status_name(_capi.OK), "FRAGCTL_OK")
        self.assertEqual(_capi.status_name(99), "FRAGCTL_ERROR_UNKNOWN")


class DefaultsTest(unittest.TestCase):
    def test_defaults_are_the_block_managers(self):
        # Held once, in C++ (zero3/options.hpp), read through the C API.
        from fragctl import _capi
        defaults = _capi.take_json(_capi.library().fragctl_zero3_default_options_json)
        config = zero3.Zero3Config()
        self.assertEqual(config.stage3_max_live_parameters, defaults["stage3_max_live_parameters"])
        self.assertEqual(config.stage3_prefetch_bucket_size, defaults["stage3_prefetch_bucket_size"])
        self.assertEqual(config.stage3_param_persistence_threshold, defaults["stage3_param_persistence_threshold"])
        self.assertEqual(config.reduce_bucket_size, defaults["reduce_bucket_size"])
        self.assertEqual(config.stage3_max_live_parameters, 1_000_000_000)  # DeepSpeed's
        self.assertEqual(zero3.parse_config().reduce_bucket_size, 500_000_000)
        self.assertEqual(zero3.Zero3Config(reduce_bucket_size=7).reduce_bucket_size, 7)

if __name__ == "__main__":
    unittest.main()
