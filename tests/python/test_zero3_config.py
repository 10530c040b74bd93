"""fragctl.torch.zero3.parse_config: DeepSpeed stage-3 options, a
zero_optimization block or a whole ds_config.json, turned into the block
manager's options; every unknown or unsupported key refused by name. Needs
no PyTorch.

    PYTHONPATH=python python3 -m unittest tests/python/test_zero3_config.py -v
"""
import json
import os
import tempfile
import unittest

from fragctl.torch import zero3


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
            zero3.parse_config({"stage": 3, "offload_param": {"device": "cpu"}, "stage3_max_reuse_distance": 1e9,
                                "stage3_max_live_paramters": 1e9, "overlap_comm": False})
        message = str(e.exception)
        for part in ("offload_param (unsupported", "stage3_max_reuse_distance (unsupported",
                     "stage3_max_live_paramters (unknown)", "overlap_comm=False (unsupported"):
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


class StatusTest(unittest.TestCase):
    def test_status_constants_are_the_librarys(self):
        # The numbers are the C enum's (the ABI); the names come from the library.
        from fragctl.torch import _interop
        for name in ("OK", "INVALID_ARGUMENT", "OUT_OF_MEMORY", "BUDGET", "COLLECTIVE", "TIMEOUT", "BACKEND", "ERROR"):
            self.assertEqual(_interop.zero3_status_name(getattr(_interop, "ZERO3_" + name)), "FRAGCTL_ZERO3_" + name)
        self.assertEqual(_interop.zero3_status_name(99), "FRAGCTL_ZERO3_UNKNOWN")


if __name__ == "__main__":
    unittest.main()
