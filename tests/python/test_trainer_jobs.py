"""The trainer benchmark's jobs (benchmarks/trainers/jobs.py, train_one.py)
without a GPU: the registry and the command line know every job; the shapes
of the variable jobs (t5, lora, vit, kvgen) are drawn the same on every run,
within their ranges, and vary; and, where PyTorch is importable (any
version, CPU), the four new jobs are built against stand-ins of
transformers, peft and timm (the real ones are only on the GPU machine) and
stepped: what each asks of those packages, what it trains, what it freezes,
that the generation job decodes token by token through the cache the model
hands back, and that an inference step runs without gradients and without
an optimizer."""
import contextlib
import io
import os
import sys
import types
import unittest
from types import SimpleNamespace
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "trainers"))
import jobs  # noqa: E402
import train_one  # noqa: E402

NEW = ["t5", "lora", "vit", "kvgen"]

try:
    import torch
except ImportError:  # Debian's python3-torch (tools/install-deps.sh --torch) gives these tests a PyTorch
    torch = None


class RegistryTest(unittest.TestCase):
    def test_every_job_is_named_and_accepted_on_the_command_line(self):
        for name in NEW:
            self.assertIn(name, jobs.NAMES)
            args = train_one.arguments(["--model", name, "--mode", "fragctl", "--out", "x.json"])
            self.assertEqual(args.model, name)
        with open(os.devnull, "w") as quiet, self.assertRaises(SystemExit), contextlib.redirect_stderr(quiet):
            train_one.arguments(["--model", "t6", "--mode", "native", "--out", "x.json"])

    def test_an_accumulating_step_records_the_shapes_of_its_own_micro_batches(self):
        # run_step gives training step s of accumulate K the batches s*K .. s*K + K - 1.
        training = SimpleNamespace(shape=lambda i: {"tokens": i})
        self.assertEqual(train_one.step_shapes(training, 2, 3),
                         [[{"tokens": 0}, {"tokens": 1}, {"tokens": 2}], [{"tokens": 3}, {"tokens": 4}, {"tokens": 5}]])
        self.assertEqual(train_one.step_shapes(training, 2), [{"tokens": 0}, {"tokens": 1}])
        inference = SimpleNamespace(shape=lambda i: {"tokens": i}, train=False)  # batch `step` whatever K is
        self.assertEqual(train_one.step_shapes(inference, 2, 3), [{"tokens": 0}, {"tokens": 1}])

    def test_a_run_needing_more_batches_than_the_jobs_draw_is_refused(self):
        base = ["--model", "t5", "--mode", "native", "--out", "x.json"]
        # 200 steps of 4 batches and 33 evaluations of 4: 932 batches, within jobs.BATCHES (1,000).
        args = train_one.arguments(base + ["--steps", "200", "--accumulate", "4", "--eval-every", "6"])
        self.assertEqual((args.steps, args.accumulate, args.eval_every), (200, 4, 6))
        for extra in (["--steps", "300", "--accumulate", "4"],  # 1,200 batches
                      ["--steps", "240", "--accumulate", "4", "--eval-every", "6"],  # 960 + 39 x 4
                      ["--accumulate", "0"]):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                train_one.arguments(base + extra)

    def test_an_unknown_job_is_refused_before_anything_is_imported(self):
        with self.assertRaisesRegex(ValueError, "unknown job 'bert'.*kvgen"):
            jobs.build("bert", None)


class DrawTest(unittest.TestCase):
    def test_source_and_target_lengths_are_drawn_apart_in_range_and_repeat(self):
        draws = jobs.source_target_lengths(1000)
        self.assertEqual(draws, jobs.source_target_lengths(1000))
        sources, targets = [s for s, _ in draws], [t for _, t in draws]
        for values, (low, high) in ((sources, jobs.T5_SOURCE), (targets, jobs.T5_TARGET)):
            self.assertTrue(all(low <= v <= high and (v - low) % 32 == 0 for v in values))
            self.assertEqual((min(values), max(values)), (low, high))
        # Two dimensions: a source length is met with several target lengths.
        self.assertGreater(len({t for s, t in draws if s == sources[0]}), 1)
        self.assertGreater(len(set(draws[:10])), 5)

    def test_image_sizes_are_patch_multiples_in_range_and_vary(self):
        sizes = jobs.image_sizes(1000)
        self.assertEqual(sizes, jobs.image_sizes(1000))
        self.assertTrue(all(v % 32 == 0 and jobs.VIT_SIZES[0] <= v <= jobs.VIT_SIZES[1] for v in sizes))
        self.assertEqual(set(sizes), set(range(jobs.VIT_SIZES[0], jobs.VIT_SIZES[1] + 1, 32)))
        self.assertGreater(len(set(sizes[:10])), 3)

    def test_generation_requests_vary_in_three_dimensions_within_the_prefill_cap(self):
        requests = jobs.generation_requests(1000)
        self.assertEqual(requests, jobs.generation_requests(1000))
        for batch, prompt, new in requests:
            self.assertIn(batch, jobs.KVGEN_BATCHES)
            self.assertTrue(jobs.KVGEN_PROMPT[0] <= prompt <= jobs.KVGEN_PROMPT[1], prompt)
            self.assertLessEqual(batch * prompt, jobs.KVGEN_PREFILL_TOKENS)
            self.assertTrue(jobs.KVGEN_NEW_TOKENS[0] <= new <= jobs.KVGEN_NEW_TOKENS[1] and new % 16 == 0, new)
        for dimension in range(3):
            self.assertGreater(len({r[dimension] for r in requests[:10]}), 2, dimension)
        self.assertEqual({r[0] for r in requests}, set(jobs.KVGEN_BATCHES))
        self.assertEqual(max(r[1] for r in requests), jobs.KVGEN_PROMPT[1])  # a single prompt reaches the top

    def test_lora_lengths_cover_its_range(self):
        lengths = jobs.sequence_lengths(1000, *jobs.LORA_TOKENS)
        self.assertLessEqual(max(lengths), jobs.LORA_TOKENS[1])
        self.assertGreater(max(lengths), 8000)
        self.assertLess(min(lengths), 300)


def fake_packages(log):
    """Stand-ins of transformers, peft and timm with the calls the jobs make, recording them in log."""
    nn = torch.nn

    class Config(SimpleNamespace):
        pass

    class CausalLM(nn.Module):
        def __init__(self, config, attention):
            super().__init__()
            self.config, self.attention = config, attention
            self.embed = nn.Embedding(config.vocab_size, 4)
            self.head = nn.Linear(4, 16)  # logits over 16 "tokens": cheap at the jobs' lengths
            self.checkpointing = None

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.checkpointing = gradient_checkpointing_kwargs

        def forward(self, input_ids, labels=None, past_key_values=None, use_cache=None, logits_to_keep=0):
            log.append(("forward", tuple(input_ids.shape), past_key_values, use_cache, logits_to_keep))
            cache = [] if past_key_values is None else past_key_values
            cache.append(input_ids.shape[1])  # grows by the tokens fed, as a KV cache does
            hidden = self.embed(input_ids).float()
            if hasattr(self, "lora_A"):
                hidden = hidden + self.lora_A.mean()
            if logits_to_keep:
                hidden = hidden[:, -logits_to_keep:]
            logits = hidden @ self.head.weight.float().t()
            loss = None
            if labels is not None:
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 16), labels.reshape(-1) % 16)
            return SimpleNamespace(logits=logits, past_key_values=cache if use_cache else None, loss=loss)

    class Seq2SeqLM(CausalLM):
        def forward(self, input_ids, labels=None):
            log.append(("seq2seq", tuple(input_ids.shape), tuple(labels.shape)))
            hidden = self.embed(labels).float() + self.embed(input_ids).float().mean()
            logits = hidden @ self.head.weight.float().t()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 16), labels.reshape(-1) % 16)
            return SimpleNamespace(loss=loss)

    def auto(cls):
        def from_config(config, attn_implementation=None):
            log.append(("from_config", cls.__name__, attn_implementation))
            return cls(config, attn_implementation)
        return SimpleNamespace(from_config=from_config)

    transformers = types.ModuleType("transformers")
    transformers.LlamaConfig = transformers.T5Config = Config
    transformers.AutoModelForCausalLM = auto(CausalLM)
    transformers.AutoModelForSeq2SeqLM = auto(Seq2SeqLM)

    peft = types.ModuleType("peft")
    peft.LoraConfig = Config

    def get_peft_model(model, config):
        log.append(("get_peft_model", config))
        model.lora_A = nn.Parameter(torch.ones(4, 4))  # the adapters: trainable, beside the frozen base
        return model
    peft.get_peft_model = get_peft_model

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.fused_attn = True

    class ViT(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.pos_embed = nn.Parameter(torch.zeros(1, 5, 4))
            self.blocks = nn.Sequential(Attention(), Attention())
            self.head = nn.Linear(3, num_classes)

        def forward(self, images):
            log.append(("vit", tuple(images.shape)))
            return self.head(images.mean(dim=(2, 3)))

    timm = types.ModuleType("timm")

    def create_model(name, pretrained, num_classes, dynamic_img_size):
        log.append(("create_model", name, pretrained, dynamic_img_size))
        return ViT(num_classes)
    timm.create_model = create_model
    return {"transformers": transformers, "peft": peft, "timm": timm}


# What run_step uses of torch, with autocast left out: a CPU build cannot enter a CUDA autocast, even a disabled one.
def cpu_torch():
    return SimpleNamespace(no_grad=torch.no_grad, bfloat16=torch.bfloat16,
                           autocast=lambda *a, **k: contextlib.nullcontext())


@unittest.skipIf(torch is None, "PyTorch is not importable (tools/install-deps.sh --torch installs Debian's)")
class JobsOnStandInsTest(unittest.TestCase):
    def build(self, name, fixed_shapes=False):
        log = []
        with mock.patch.dict(sys.modules, fake_packages(log)), mock.patch.object(torch.Tensor, "cuda", lambda t: t):
            torch.manual_seed(0)
            job = jobs.build(name, torch, fixed_shapes)
            optimizer = train_one.make_optimizer(job, torch)
            held, losses = {}, []
            for step in range(2):
                before = [p.detach().clone() for p in job.parameters]
                losses.append(train_one.run_step(job, cpu_torch(), optimizer, step, held))
                inputs, labels = held["batch"]
                self.check_batch(name, job, step, inputs, labels)
                if getattr(job, "train", True):
                    self.assertTrue(any(not torch.equal(a, p) for a, p in zip(before, job.parameters)), name)
                    self.assertTrue(all(p.grad is None for p in job.parameters), name)
        self.assertTrue(all(isinstance(v, float) for v in losses))
        return job, log

    def check_batch(self, name, job, step, inputs, labels):
        shape = job.shape(step)
        if name == "t5":
            self.assertEqual((inputs.shape[1], labels.shape[1]), (shape["source_tokens"], shape["target_tokens"]))
        elif name == "lora":
            self.assertEqual(tuple(inputs.shape), (1, shape["tokens"]))
        elif name == "vit":
            self.assertEqual(tuple(inputs.shape[1:]), (3, shape["image_px"], shape["image_px"]))
        else:
            self.assertEqual((tuple(inputs.shape), labels), ((shape["batch"], shape["prompt_tokens"]),
                                                             shape["new_tokens"]))

    def test_t5_is_a_seq2seq_model_with_eager_attention_trained_whole(self):
        job, log = self.build("t5")
        self.assertIn(("from_config", "Seq2SeqLM", "eager"), log)
        self.assertEqual(sum(1 for e in log if e[0] == "seq2seq"), 2)
        self.assertFalse(job.model.config.use_cache)
        self.assertEqual(len(job.parameters), len(list(job.model.parameters())))

    def test_lora_trains_only_the_adapters_of_a_checkpointed_frozen_llama(self):
        job, log = self.build("lora")
        config = next(e[1] for e in log if e[0] == "get_peft_model")
        self.assertEqual(config.task_type, "CAUSAL_LM")
        self.assertEqual(set(config.target_modules), {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"})
        self.assertEqual(job.model.checkpointing, {"use_reentrant": False})
        self.assertEqual([p is job.model.lora_A for p in job.parameters], [True])
        self.assertFalse(job.model.embed.weight.requires_grad)

    def test_vit_has_dynamic_image_size_eager_attention_and_a_frozen_position_embedding(self):
        job, log = self.build("vit")
        self.assertIn(("create_model", "vit_large_patch16_224", False, True), log)
        self.assertEqual([m.fused_attn for m in job.model.blocks], [False, False])
        self.assertFalse(job.model.pos_embed.requires_grad)
        self.assertFalse(any(p is job.model.pos_embed for p in job.parameters))
        self.assertTrue(job.autocast)

    def test_kvgen_decodes_token_by_token_through_the_cache_without_gradients(self):
        job, log = self.build("kvgen")
        self.assertFalse(job.train)
        self.assertEqual(job.parameters, [])
        self.assertIn(("from_config", "CausalLM", "eager"), log)
        forwards = [e for e in log if e[0] == "forward"]
        (b0, p0, n0), (b1, p1, n1) = jobs.generation_requests(2)
        self.assertEqual(len(forwards), n0 + n1)
        first, rest = forwards[0], forwards[1:n0]
        self.assertEqual(first[1:], ((b0, p0), None, True, 1))  # the prompt, no cache yet
        cache = rest[0][2]
        self.assertEqual(cache, [p0] + [1] * (n0 - 1))  # one cache, fed one token at a time
        self.assertTrue(all(e[1] == (b0, 1) and e[2] is cache and e[4] == 1 for e in rest))
        self.assertEqual(forwards[n0][1:3], ((b1, p1), None))  # the next request starts a new cache

    def test_with_fixed_shapes_every_step_has_the_first_draws_shape(self):
        for name in ("t5", "lora", "vit", "kvgen"):
            drawn, _ = self.build(name)
            fixed, _ = self.build(name, fixed_shapes=True)  # build() checks steps 0 and 1's batches against shape
            self.assertEqual([fixed.shape(i) for i in range(40)], [drawn.shape(0)] * 40, name)
            self.assertNotEqual([drawn.shape(i) for i in range(40)], [drawn.shape(0)] * 40, name)
        with mock.patch.object(torch.Tensor, "cuda", lambda t: t):  # the token jobs' batches (no shape())
            fixed = jobs._token_batches(torch, 100, 2, 128, 4096, True)
            drawn = jobs._token_batches(torch, 100, 2, 128, 4096, False)
            lengths = {fixed(i)[0].shape[1] for i in range(20)}
            drawn = {drawn(i)[0].shape[1] for i in range(20)}
        self.assertEqual(lengths, {jobs.sequence_lengths(1, 128, 4096)[0]})
        self.assertGreater(len(drawn), 1)

    def test_an_inference_step_has_no_gradients_and_a_training_step_has(self):
        grad_enabled = []

        def forward(inputs, labels):
            grad_enabled.append(torch.is_grad_enabled())
            return (weight * inputs).sum()
        weight = torch.nn.Parameter(torch.ones(3))
        batch = lambda step: (torch.full((3,), float(step + 1)), None)  # noqa: E731
        inference = SimpleNamespace(make_batch=batch, forward=forward, autocast=False, train=False, parameters=[])
        self.assertIsNone(train_one.make_optimizer(inference, torch))
        self.assertEqual(train_one.run_step(inference, cpu_torch(), None, 1, {}), 6.0)
        self.assertIsNone(weight.grad)
        training = SimpleNamespace(make_batch=batch, forward=forward, autocast=False, parameters=[weight])
        optimizer = train_one.make_optimizer(training, torch)
        self.assertEqual(train_one.run_step(training, cpu_torch(), optimizer, 0, {}), 3.0)
        self.assertEqual(grad_enabled, [False, True])
        self.assertLess(weight.detach().max().item(), 1.0)  # AdamW stepped

    def test_an_accumulating_step_runs_its_micro_batches_then_one_optimizer_step(self):
        seen = []

        def forward(inputs, labels):
            seen.append(float(inputs[0]))
            return (weight * inputs).sum()
        weight = torch.nn.Parameter(torch.ones(3))
        batch = lambda step: (torch.full((3,), float(step + 1)), None)  # noqa: E731
        job = SimpleNamespace(make_batch=batch, forward=forward, autocast=False, parameters=[weight])
        optimizer = torch.optim.SGD([weight], lr=0.1)
        steps, step = [], optimizer.step

        def counted_step():
            steps.append(len(seen))
            step()
        optimizer.step = counted_step
        loss = train_one.run_step(job, cpu_torch(), optimizer, 1, {}, accumulate=3)
        self.assertEqual(seen, [4.0, 5.0, 6.0])  # batches 3, 4, 5: step 1 of three micro-batches each
        self.assertEqual(steps, [3])  # one optimizer step, after the last backward
        self.assertEqual(loss, 18.0)  # the last micro-batch's loss, unscaled
        # The gradients of the three scaled losses summed: (4 + 5 + 6) / 3 per element, one SGD step of lr 0.1.
        self.assertTrue(torch.allclose(weight.detach(), torch.full((3,), 1.0 - 0.1 * 5.0)))
        self.assertIsNone(weight.grad)

    def test_an_evaluation_runs_in_eval_mode_without_gradients_on_batches_of_its_own(self):
        log = []
        with mock.patch.dict(sys.modules, fake_packages(log)), mock.patch.object(torch.Tensor, "cuda", lambda t: t):
            torch.manual_seed(0)
            job = jobs.build("vit", torch)
            seen, forward = [], job.forward

            def watched(inputs, labels):
                loss = forward(inputs, labels)
                seen.append((job.model.training, torch.is_grad_enabled(), loss.requires_grad, inputs.shape[-1]))
                return loss
            job.forward = watched
            before = [p.detach().clone() for p in job.parameters]
            losses = train_one.run_eval(job, cpu_torch(), 12, 3)
        self.assertEqual(len(losses), 3)
        self.assertTrue(all(isinstance(v, float) for v in losses))
        self.assertEqual([s[:3] for s in seen], [(False, False, False)] * 3)
        self.assertEqual([s[3] for s in seen], [job.shape(12 + i)["image_px"] for i in range(3)])
        self.assertTrue(job.model.training)  # back to training
        self.assertTrue(all(torch.equal(a, p) for a, p in zip(before, job.parameters)))
        self.assertTrue(all(p.grad is None for p in job.parameters))


if __name__ == "__main__":
    unittest.main()
