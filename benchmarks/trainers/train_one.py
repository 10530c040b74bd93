"""One training run in this process: a model, an allocator set-up, N steps.

    python train_one.py --model gpt2m|llama|resnet|declm|moe|frozen|t5|lora|vit|kvgen
                        --mode native|expandable|async|fragctl|preload
                        [--policy arena] [--steps 12] [--report r.json] [--warmup-profile p.json]
                        [--eval-every K [--eval-batches M]] [--accumulate K] [--fixed-shapes] --out run.json

The allocator set-up outside this process (PYTORCH_CUDA_ALLOC_CONF,
LD_PRELOAD, FRAGCTL_*) comes from run_trainers.py; in --mode fragctl this
process calls fragctl.torch.enable(policy) before CUDA is touched.
Deterministic: torch.use_deterministic_algorithms(True) (with
CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment), fixed seeds, the same
inputs every run, eager attention. Writes step times, the loss after every
step (exact, as float.hex), peak device memory used (memsampler.py) and
fragctl's or PyTorch's own peaks to --out. An inference job (kvgen) runs
the same loop without backward and optimizer; its "loss" is a value of its
output (jobs.py), compared as the trainers' losses are. Jobs drawn in several
dimensions (t5, lora, vit, kvgen) write each step's shape as "shapes"
(with --accumulate K > 1, a training step's is its K micro-batches' list).
With --eval-every K a training job evaluates after every Kth step but the
last, as a Trainer with eval_steps does: M forward passes under no_grad with
the model in eval mode, on batches of their own; their losses are
"eval_losses", their driver calls fall between "memory_calls_after_step"
and the next step's "memory_calls_before_step", and their time is in no
step's. With --accumulate K a training step is K micro-batches (forward and
backward each, losses scaled by 1/K) and one optimizer step. With
--fixed-shapes every step has the shape of the job's first draw (jobs.py):
a job whose shapes repeat.
"""
import argparse
import json
import os
import sys
import time
import traceback
import warnings

import jobs
import memsampler

HERE = os.path.dirname(os.path.abspath(__file__))


MODES = ["native", "expandable", "async", "fragctl", "preload"]


def arguments(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, choices=jobs.NAMES)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--policy", default="arena")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--timed-from", type=int, default=2, help="steps before this are warm-up, not timed")
    parser.add_argument("--report", default="")
    parser.add_argument("--warmup-profile", default="")
    parser.add_argument("--no-sampler", action="store_true", help="do not sample device memory (capacity.py samples)")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="a training job evaluates after every Nth step but the last (0: never)")
    parser.add_argument("--eval-batches", type=int, default=4, help="forward passes of one evaluation")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="a training job's step is this many forward and backward passes, then one optimizer step")
    parser.add_argument("--fixed-shapes", action="store_true",
                        help="every batch takes the shape of the job's first draw (a job whose shapes repeat)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.accumulate < 1 or args.eval_every < 0 or args.eval_batches < 1:
        parser.error("--accumulate and --eval-batches take 1 or more, --eval-every 0 or more")
    evaluations = (args.steps - 1) // args.eval_every if args.eval_every else 0
    needed = args.steps * args.accumulate + evaluations * args.eval_batches
    if needed > jobs.BATCHES:
        parser.error("%d steps of %d batches and %d evaluations of %d need %d batches; the jobs draw %d"
                     % (args.steps, args.accumulate, evaluations, args.eval_batches, needed, jobs.BATCHES))
    return args


def make_optimizer(job, torch):
    """AdamW over the job's trainable parameters; None for an inference job (train False)."""
    return torch.optim.AdamW(job.parameters, lr=1e-4) if getattr(job, "train", True) else None


def run_step(job, torch, optimizer, step, held, accumulate=1):
    """One step of job: its batch, the forward (under bf16 autocast if the job asks), then for a training job the
    backward, the optimizer's step and zero_grad(set_to_none=True); an inference job's forward runs under
    no_grad and nothing else. With accumulate K (a training job) the step is K forward and backward passes on
    the batches step*K to step*K + K - 1, each loss scaled by 1/K, the gradients summed, then one optimizer step:
    a Trainer's gradient_accumulation_steps. Returns the (last) loss as a float (.item() synchronizes). held (a
    dict kept by the caller from step to step) keeps the batch and loss referenced until the next ones replace
    them, as a loop's variables do: the previous batch is released once the new one exists, the previous loss
    once the new forward has returned."""
    if not getattr(job, "train", True):
        held["batch"] = job.make_batch(step)
        inputs, labels = held["batch"]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=job.autocast):
            held["loss"] = job.forward(inputs, labels)
        return held["loss"].item()
    for index in step_batches(step, accumulate):
        held["batch"] = job.make_batch(index)
        inputs, labels = held["batch"]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=job.autocast):
            held["loss"] = job.forward(inputs, labels)
        (held["loss"] / accumulate if accumulate > 1 else held["loss"]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return held["loss"].item()


def step_batches(step, accumulate):
    """The batches a training step of accumulate K runs: step*K to step*K + K - 1."""
    return range(step * accumulate, (step + 1) * accumulate)


def step_shapes(job, steps, accumulate=1):
    """Each step's shape, of the batches run_step gives it: a training step of accumulate K > 1 runs batches
    step*K to step*K + K - 1, so its shape is a list of theirs (job.shape(step) would name another step's
    batch); an inference step runs batch `step` whatever K is."""
    if accumulate <= 1 or not getattr(job, "train", True):
        return [job.shape(step) for step in range(steps)]
    return [[job.shape(index) for index in step_batches(step, accumulate)] for step in range(steps)]


def run_eval(job, torch, first, batches):
    """An evaluation between training steps: `batches` forward passes under no_grad with the model in eval mode
    (dropout off, no activations kept), on the job's batches first, first + 1, ... (indices no training step
    uses), and the model back in training mode after. Returns their losses as floats."""
    job.model.eval()
    losses = []
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=job.autocast):
            for i in range(batches):
                inputs, labels = job.make_batch(first + i)
                losses.append(job.forward(inputs, labels).item())
                del inputs, labels
    finally:
        job.model.train()
    return losses


def train(args, result):
    """Runs args.steps steps of args.model under the allocator set-up of args.mode in this process (which has not
    touched CUDA yet) and adds step times, losses and the allocator's own peaks to result. Raises what the job
    raises (an out-of-memory error included)."""
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
        job = jobs.build(args.model, torch, args.fixed_shapes)
    optimizer = make_optimizer(job, torch)
    result["parameters"] = sum(p.numel() for p in job.model.parameters())
    result["trainable_parameters"] = sum(p.numel() for p in job.parameters)
    result["batch"] = job.batch
    result["train"] = getattr(job, "train", True)
    result["fixed_shapes"] = args.fixed_shapes
    if hasattr(job, "shape"):
        result["shapes"] = step_shapes(job, args.steps, args.accumulate)
    step_times, losses, calls_after_step, calls_before_step, eval_losses, held = [], [], [], [], [], {}
    fragctl_stats = None
    if args.mode in ("fragctl", "preload"):
        import fragctl
        fragctl_stats = fragctl.stats
    evaluates = args.eval_every > 0 and optimizer is not None
    next_eval_batch = args.steps * args.accumulate  # evaluation batches follow the training steps' ones
    for step in range(args.steps):
        torch.cuda.synchronize()
        if fragctl_stats is not None:
            calls_before_step.append(fragctl_stats(0)["backend_counters"]["memory_calls"])
        start = time.perf_counter()
        value = run_step(job, torch, optimizer, step, held, args.accumulate)
        step_times.append(time.perf_counter() - start)
        losses.append(value)
        if fragctl_stats is not None:  # after the timed part of the step
            calls_after_step.append(fragctl_stats(0)["backend_counters"]["memory_calls"])
        if evaluates and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            eval_losses.append(run_eval(job, torch, next_eval_batch, args.eval_batches))
            next_eval_batch += args.eval_batches
    timed = step_times[args.timed_from:] or step_times
    result.update({
        "step_times_s": step_times,
        "mean_step_s": sum(timed) / len(timed),
        "median_step_s": sorted(timed)[len(timed) // 2],
        "losses": losses,
        "losses_hex": [float(v).hex() for v in losses],
        "nondeterministic_ops": sorted(set(w.split(" does not")[0] for w in caught if "deterministic" in w)),
    })
    if args.accumulate > 1:
        result["accumulate"] = args.accumulate
    if evaluates:
        result["eval_every"] = args.eval_every
        result["eval_losses"] = eval_losses
        result["eval_losses_hex"] = [[float(v).hex() for v in e] for e in eval_losses]
    if fragctl_stats is not None:
        s = fragctl_stats(0)
        result["fragctl"] = {
            "allocator": s["allocator"], "backend": s["backend"],
            "peak_requested_bytes": s["requested_bytes"]["peak"],
            "peak_reserved_bytes": s["reserved_bytes"]["peak"],
            "reserved_over_requested": s["derived"]["reserved_over_requested"],
            "allocations": s["allocations"], "memory_calls": s["backend_counters"]["memory_calls"],
            "memory_calls_after_step": calls_after_step,
            "memory_calls_before_step": calls_before_step,
            "ooms": s["ooms"],
        }
        if args.timed_from >= 1 and len(calls_after_step) > args.timed_from:
            f = result["fragctl"]
            # Within the timed steps only: an evaluation's calls fall between one step and the next.
            f["memory_calls_timed"] = sum(after - before for before, after in
                                          zip(calls_before_step[args.timed_from:], calls_after_step[args.timed_from:]))
            f["memory_calls_per_timed_step"] = f["memory_calls_timed"] / (len(calls_after_step) - args.timed_from)
    else:
        try:  # cudaMallocAsync's statistics lack some fields on some torch versions
            result["torch_allocator"] = {
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            }
        except RuntimeError as e:
            result["torch_allocator_error"] = str(e)


def main():
    args = arguments()
    result = {"model": args.model, "mode": args.mode, "policy": args.policy if args.mode != "native" else "",
              "steps": args.steps, "error": None}
    sampler, baseline = None, 0
    try:
        if not args.no_sampler:
            try:
                sampler, baseline, total = memsampler.start()
                result["device_total_bytes"] = total
            except (OSError, RuntimeError, ValueError) as e:  # the run goes on without the device peak
                result["sampler_error"] = str(e)
        train(args, result)
    except Exception as e:  # reported, not raised: the other runs go on
        result["error"] = "%s: %s" % (type(e).__name__, e)
        result["out_of_memory"] = "out of memory" in str(e).lower() or "OutOfMemory" in type(e).__name__
        traceback.print_exc()
    finally:
        result["peak_device_used_bytes"] = None
        if sampler is not None:
            peak = memsampler.stop(sampler)
            result["peak_device_used_bytes"] = max(0, peak - baseline)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("%s %s %s: %s" % (args.model, args.mode, result["policy"],
                            result["error"] or "mean step %.1f ms, last loss %.6f"
                            % (1e3 * result["mean_step_s"], result["losses"][-1])))
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
