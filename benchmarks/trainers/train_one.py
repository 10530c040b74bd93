"""One training run in this process: a model, an allocator set-up, N steps.

    python train_one.py --model gpt2m|llama|resnet --mode native|expandable|fragctl|preload
                        [--policy arena] [--steps 12] [--report r.json] [--warmup-profile p.json]
                        --out run.json

The allocator set-up outside this process (PYTORCH_CUDA_ALLOC_CONF,
LD_PRELOAD, FRAGCTL_*) comes from run_trainers.py; in --mode fragctl this
process calls fragctl.torch.enable(policy) before CUDA is touched.
Deterministic: torch.use_deterministic_algorithms(True) (with
CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment), fixed seeds, the same
inputs every run, eager attention. Writes step times, the loss after every
step (exact, as float.hex), peak device memory used (memsampler.py) and
fragctl's or PyTorch's own peaks to --out.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def start_sampler():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    sampler = subprocess.Popen([sys.executable, os.path.join(HERE, "memsampler.py")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)
    line = sampler.stdout.readline().split()
    if not line or line[0] != "ready":
        raise RuntimeError("memsampler failed: %s" % " ".join(line))
    return sampler, int(line[1]), int(line[2])


def stop_sampler(sampler):
    sampler.stdin.close()
    line = sampler.stdout.readline().split()
    sampler.wait(timeout=30)
    return int(line[1]) if line and line[0] == "peak" else 0


def sequence_lengths(steps, low, high, seed=1234):
    rng = random.Random(seed)
    return [rng.randrange(low, high + 1, 32) for _ in range(steps)]


def build(model_name, torch):
    """(model, make_batch(step) -> (inputs, labels), loss_fn (None: the model computes the loss), batch)."""
    if model_name in ("gpt2m", "llama"):
        import transformers
        if model_name == "gpt2m":  # GPT-2 medium: 24 layers, 1024 wide, 16 heads (355M parameters)
            config = transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50257)
            batch, low, high = 8, 128, 512
        else:  # Llama-shaped: RMSNorm, SwiGLU, RoPE, grouped-query attention (about 270M parameters)
            config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                                              num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                                              max_position_embeddings=2048)
            batch, low, high = 8, 128, 768
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        except TypeError:
            config._attn_implementation = "eager"
            model = transformers.AutoModelForCausalLM.from_config(config)
        vocab = config.vocab_size
        lengths = sequence_lengths(1000, low, high)
        generator = torch.Generator(device="cpu").manual_seed(7)

        def make_batch(step):
            tokens = torch.randint(0, vocab, (batch, lengths[step]), generator=generator, device="cpu").cuda()
            return tokens, tokens
        return model, make_batch, None, batch

    import torchvision

    class GlobalAveragePool(torch.nn.Module):
        # AdaptiveAvgPool2d has no deterministic backward on CUDA; a mean has.
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    model = torchvision.models.resnet50(num_classes=1000)
    model.avgpool = GlobalAveragePool()
    batch = 32
    sizes = [random.Random(99 + i).choice([160, 192, 224, 256]) for i in range(1000)]
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        images = torch.randn(batch, 3, sizes[step], sizes[step], generator=generator, device="cpu").cuda()
        labels = torch.randint(0, 1000, (batch,), generator=generator, device="cpu").cuda()
        return images, labels
    return model, make_batch, torch.nn.functional.cross_entropy, batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, choices=["gpt2m", "llama", "resnet"])
    parser.add_argument("--mode", required=True, choices=["native", "expandable", "fragctl", "preload"])
    parser.add_argument("--policy", default="arena")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--timed-from", type=int, default=2, help="steps before this are warm-up, not timed")
    parser.add_argument("--report", default="")
    parser.add_argument("--warmup-profile", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    result = {"model": args.model, "mode": args.mode, "policy": args.policy if args.mode != "native" else "",
              "steps": args.steps, "error": None}
    sampler, baseline = None, 0
    try:
        try:
            sampler, baseline, total = start_sampler()
            result["device_total_bytes"] = total
        except (OSError, RuntimeError, ValueError) as e:  # the run goes on without the device peak
            result["sampler_error"] = str(e)
        import torch
        if args.mode == "fragctl":
            import fragctl.torch
            options = {}
            if args.report:
                options["report"] = args.report
            if args.warmup_profile and os.path.exists(args.warmup_profile):
                options["warmup_profile"] = args.warmup_profile
            fragctl.torch.enable(args.policy, **options)
        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        result["torch"] = torch.__version__
        result["gpu"] = torch.cuda.get_device_name(0)
        caught = []
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *a, **k: caught.append(str(message))

        with torch.device("cuda"):
            model, make_batch, loss_fn, batch = build(args.model, torch)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        result["batch"] = batch
        step_times, losses, calls_after_step = [], [], []
        fragctl_stats = None
        if args.mode in ("fragctl", "preload"):
            import fragctl
            fragctl_stats = fragctl.stats
        for step in range(args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            inputs, labels = make_batch(step)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if loss_fn is None:
                    loss = model(input_ids=inputs, labels=labels).loss
                else:
                    loss = loss_fn(model(inputs).float(), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            value = loss.item()  # synchronizes
            step_times.append(time.perf_counter() - start)
            losses.append(value)
            if fragctl_stats is not None:  # after the timed part of the step
                calls_after_step.append(fragctl_stats(0)["backend_counters"]["memory_calls"])
        timed = step_times[args.timed_from:] or step_times
        result.update({
            "step_times_s": step_times,
            "mean_step_s": sum(timed) / len(timed),
            "median_step_s": sorted(timed)[len(timed) // 2],
            "losses": losses,
            "losses_hex": [float(v).hex() for v in losses],
            "nondeterministic_ops": sorted(set(w.split(" does not")[0] for w in caught
                                               if "deterministic" in w)),
        })
        if fragctl_stats is not None:
            s = fragctl_stats(0)
            result["fragctl"] = {
                "allocator": s["allocator"], "backend": s["backend"],
                "peak_requested_bytes": s["requested_bytes"]["peak"],
                "peak_reserved_bytes": s["reserved_bytes"]["peak"],
                "reserved_over_requested": s["derived"]["reserved_over_requested"],
                "allocations": s["allocations"], "memory_calls": s["backend_counters"]["memory_calls"],
                "memory_calls_after_step": calls_after_step,
                "ooms": s["ooms"],
            }
            if args.timed_from >= 1 and len(calls_after_step) > args.timed_from:
                f = result["fragctl"]
                f["memory_calls_timed"] = calls_after_step[-1] - calls_after_step[args.timed_from - 1]
        elif args.mode in ("native", "expandable"):
            result["torch_allocator"] = {
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            }
    except Exception as e:  # reported, not raised: the other runs go on
        result["error"] = "%s: %s" % (type(e).__name__, e)
        traceback.print_exc()
    finally:
        result["peak_device_used_bytes"] = None
        if sampler is not None:
            peak = stop_sampler(sampler)
            result["peak_device_used_bytes"] = max(0, peak - baseline)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("%s %s %s: %s" % (args.model, args.mode, result["policy"],
                            result["error"] or "mean step %.1f ms, last loss %.6f"
                            % (1e3 * result["mean_step_s"], result["losses"][-1])))
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
