"""A replay model of issue 16's `declm` job: writes a FRAGCTL_TRACE-format trace
(docs/traces.md: action,addr,size,stream,time_us) of the allocations a
gradient-checkpointed decoder LM makes, for `fragctl replay` without a GPU.

    python3 benchmarks/trainers/declm_trace.py --out declm-model.trace.csv.gz [--steps 10] [--layers 22]

What it models (jobs.py's declm: TinyLlama's shape, bf16, batch 2, AdamW,
non-reentrant checkpointing of every decoder layer, eager attention):
  * parameters created once, in module order; AdamW's exp_avg and exp_avg_sq
    created at the first optimizer step, parameter by parameter;
  * per step, a sequence length from jobs.sequence_lengths (the live job's
    draw, 128-4096 tokens); the token and label tensors;
  * forward: embedding, then every layer run without keeping its insides
    (each intermediate freed after its last use), only the layer's output
    kept as the next layer's checkpointed input; final norm, the logits
    (bf16), their fp32 copy, log-softmax and the loss as HF's loss does;
  * backward: the loss and head, then per layer in reverse the recompute
    (the insides again, the tensors backward needs kept) and the layer's
    backward, op by op in reverse: gradients of the op's inputs allocated,
    the op's saved tensors and its output's gradient freed, parameter
    gradients allocated on first contribution and kept (set_to_none);
  * the foreach AdamW step (one temporary per parameter, sqrt of exp_avg_sq,
    allocated for all parameters, then freed), zero_grad(set_to_none=True)
    freeing every gradient in parameter order;
  * the op-level tensors of HF's Llama layer: RMSNorm's fp32 upcast, pow,
    mean, rsqrt; q/k/v projections; rotary embedding (two products, a
    rotate_half cat and a sum per q and k); repeat_kv copies of k and v; the
    eager attention's scores, scaled scores, masked scores, fp32 softmax and
    its bf16 copy; the attention output and its contiguous transpose; o_proj;
    the residual sums; the SwiGLU MLP (gate, up, silu, product, down).
  * time_us: the host's clock, 20 us per allocator call, and at the end of
    each step a wait (loss.item()) until a modelled GPU has run the step
    (bytes written at 1.5 TB/s plus matmul FLOPs at 300 TFLOP/s). Replay's
    --gpu-lag-us models the GPU's lag on top (docs/replay.md "GPU lag").
What it does not model: allocations inside kernels and libraries (cuBLAS
workspaces, autocast caches), the exact order in which the autograd engine
frees tensors that become free in the same node, grad accumulation into an
existing buffer (the first contribution is taken as the gradient),
checkpoint's early stop of the recompute, a GPU lag that varies within a
step, and one stream only (the job's compute stream; no copies or
collectives). Sizes are the tensors' bytes, unrounded, as PyTorch asks.
It is a model for comparing arena settings, not a substitute for the live
run (tools/gpu/trainers.sh --livebytes).
"""
import argparse
import gzip
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs  # noqa: E402  (sequence_lengths: the live job's draw)

BF16, F32 = 2, 4
NO_GRAD = {"mask", "labels"}  # inputs without a gradient


class trace_writer:
    """Allocation events with unique addresses and the modelled host clock."""

    def __init__(self, out):
        self.out = out
        self.next_addr = 1 << 40
        self.live = {}
        self.now_us = 0
        self.gpu_us = 0.0
        self.rows = 0
        out.write("action,addr,size,stream,time_us\n")

    def alloc(self, size):
        addr = self.next_addr
        self.next_addr += (size + 4095) // 4096 * 4096 + 4096
        self.live[addr] = size
        self._row("alloc", addr, size)
        self.gpu_us += size / 1.5e6  # bytes written at 1.5 TB/s
        return addr

    def free(self, addr):
        self._row("free_requested", addr, self.live.pop(addr))

    def flops(self, n):
        self.gpu_us += n / 300e6  # 300 TFLOP/s

    def synchronize(self):
        self.now_us = max(self.now_us, int(self.gpu_us))

    def _row(self, action, addr, size):
        self.now_us += 20
        self.gpu_us = max(self.gpu_us, self.now_us)
        self.out.write(f"{action},{addr},{size},0,{self.now_us}\n")
        self.rows += 1


class op:
    """One tensor-producing operation: its output's size, its tensor inputs, which of them (or 'out') backward
    saves, its parameter (name) if any, and its matmul FLOPs."""

    def __init__(self, name, size, inputs=(), saves=(), param=None, flops=0):
        self.name, self.size, self.inputs, self.saves, self.param, self.flops = name, size, list(inputs), list(
            saves), param, flops


def rmsnorm(p, x, rows, H, weight):
    """LlamaRMSNorm: fp32 upcast, pow, mean, rsqrt, product, bf16 cast, weight product."""
    t = rows * H
    return [
        op(p + "f32", t * F32, [x]),
        op(p + "pow", t * F32, [p + "f32"]),
        op(p + "mean", rows * F32, [p + "pow"]),
        op(p + "rsqrt", rows * F32, [p + "mean"], saves=["out"]),
        op(p + "normed", t * F32, [p + "f32", p + "rsqrt"], saves=[p + "f32"]),
        op(p + "cast", t * BF16, [p + "normed"]),
        op(p + "out", t * BF16, [p + "cast"], saves=[p + "cast"], param=weight),
    ]


def layer_ops(i, x, B, L, cfg):
    H, I, nh, nkv, d = cfg["H"], cfg["I"], cfg["heads"], cfg["kv"], cfg["H"] // cfg["heads"]
    t = B * L * H  # elements of a hidden-state tensor
    kvt = B * L * nkv * d
    sc = B * nh * L * L
    p = f"l{i}."
    ops = rmsnorm(p + "n1.", x, B * L, H, p + "input_layernorm")
    n1 = p + "n1.out"
    ops += [
        op(p + "q", t * BF16, [n1], saves=[n1], param=p + "q_proj", flops=2 * B * L * H * H),
        op(p + "k", kvt * BF16, [n1], saves=[n1], param=p + "k_proj", flops=2 * B * L * H * nkv * d),
        op(p + "v", kvt * BF16, [n1], saves=[n1], param=p + "v_proj", flops=2 * B * L * H * nkv * d),
    ]
    for name, n in (("q", t), ("k", kvt)):
        r = p + "rope_" + name
        ops += [
            op(r + "_cos", n * BF16, [p + name]),
            op(r + "_half", n * BF16, [p + name]),
            op(r + "_sin", n * BF16, [r + "_half"]),
            op(r, n * BF16, [r + "_cos", r + "_sin"]),
        ]
    ops += [
        op(p + "k_rep", t * BF16, [p + "rope_k"], saves=["out"]),
        op(p + "v_rep", t * BF16, [p + "v"], saves=["out"]),
        op(p + "scores", sc * BF16, [p + "rope_q", p + "k_rep"], saves=[p + "rope_q", p + "k_rep"],
           flops=2 * B * nh * L * L * d),
        op(p + "scaled", sc * BF16, [p + "scores"]),
        op(p + "masked", sc * BF16, [p + "scaled", "mask"]),
        op(p + "probs32", sc * F32, [p + "masked"], saves=["out"]),
        op(p + "probs", sc * BF16, [p + "probs32"]),
        op(p + "attn", t * BF16, [p + "probs", p + "v_rep"], saves=[p + "probs", p + "v_rep"],
           flops=2 * B * nh * L * L * d),
        op(p + "attn_t", t * BF16, [p + "attn"]),
        op(p + "o", t * BF16, [p + "attn_t"], saves=[p + "attn_t"], param=p + "o_proj", flops=2 * B * L * H * H),
        op(p + "h", t * BF16, [x, p + "o"]),
    ]
    ops += rmsnorm(p + "n2.", p + "h", B * L, H, p + "post_attention_layernorm")
    n2 = p + "n2.out"
    ops += [
        op(p + "gate", B * L * I * BF16, [n2], saves=[n2], param=p + "gate_proj", flops=2 * B * L * H * I),
        op(p + "up", B * L * I * BF16, [n2], saves=[n2], param=p + "up_proj", flops=2 * B * L * H * I),
        op(p + "act", B * L * I * BF16, [p + "gate"], saves=[p + "gate"]),
        op(p + "prod", B * L * I * BF16, [p + "act", p + "up"], saves=[p + "act", p + "up"]),
        op(p + "down", t * BF16, [p + "prod"], saves=[p + "prod"], param=p + "down_proj", flops=2 * B * L * H * I),
        op(p + "out", t * BF16, [p + "h", p + "down"]),
    ]
    return ops


def parameters(cfg):
    """(name, bytes) in module order, as model.parameters() yields them."""
    H, I, nkv, d, V = cfg["H"], cfg["I"], cfg["kv"], cfg["H"] // cfg["heads"], cfg["V"]
    out = [("embed", V * H * BF16)]
    for i in range(cfg["layers"]):
        p = f"l{i}."
        out += [(p + "q_proj", H * H * BF16), (p + "k_proj", H * nkv * d * BF16), (p + "v_proj", H * nkv * d * BF16),
                (p + "o_proj", H * H * BF16), (p + "gate_proj", H * I * BF16), (p + "up_proj", H * I * BF16),
                (p + "down_proj", I * H * BF16), (p + "input_layernorm", H * BF16),
                (p + "post_attention_layernorm", H * BF16)]
    out += [("norm", H * BF16), ("lm_head", V * H * BF16)]
    return out


def run_forward(w, ops, env, keep, grad):
    """Runs ops: allocates outputs into env; frees a tensor after its last use unless it is in keep or (with
    grad) saved by an op; returns {tensor: [ops saving it]} for backward."""
    last_use = {}
    for k, o in enumerate(ops):
        for name in o.inputs:
            last_use[name] = k
    saved = {}
    for k, o in enumerate(ops):
        env[o.name] = w.alloc(o.size)
        w.flops(o.flops)
        if grad:
            for s in o.saves:
                saved.setdefault(o.name if s == "out" else s, []).append(o.name)
        for name in dict.fromkeys(o.inputs):
            if last_use[name] == k and name in env and name not in keep and name not in saved:
                w.free(env.pop(name))
        if last_use.get(o.name) is None and o.name not in keep and o.name not in saved:
            w.free(env.pop(o.name))
    return saved


def run_backward(w, ops, env, saved, grads, param_grads, param_sizes, sizes):
    """Backward through ops in reverse: each op allocates its inputs' gradients (parameter gradients kept),
    frees its output's gradient and the tensors only it still saved."""
    for o in reversed(ops):
        if o.name not in grads:
            continue
        for name in dict.fromkeys(o.inputs):
            if name in NO_GRAD or name in grads:
                continue
            grads[name] = w.alloc(sizes[name])
        w.flops(2 * o.flops)
        if o.param and o.param not in param_grads:
            param_grads[o.param] = w.alloc(param_sizes[o.param])
        w.free(grads.pop(o.name))
        for s in o.saves:
            name = o.name if s == "out" else s
            holders = saved.get(name, [])
            if o.name in holders:
                holders.remove(o.name)
            if not holders and name in env:
                saved.pop(name, None)
                w.free(env.pop(name))
        if o.name in env and o.name not in saved:
            w.free(env.pop(o.name))


def step(w, cfg, L, params, opt_state, param_sizes):
    B, H, V = cfg["B"], cfg["H"], cfg["V"]
    t = B * L * H
    env = {"ids": w.alloc(B * L * 8), "labels": w.alloc(B * L * 8)}
    env["mask"] = w.alloc(B * L * L * BF16)
    env["x0"] = w.alloc(t * BF16)  # embedding output
    sizes = {"x0": t * BF16}
    for i in range(cfg["layers"]):  # checkpointed forward: only layer outputs stay
        ops = layer_ops(i, f"x{i}", B, L, cfg)
        for o in ops:
            sizes[o.name] = o.size
        run_forward(w, ops, env, keep={f"x{i}", "mask", f"l{i}.out"}, grad=False)
        env[f"x{i + 1}"] = env.pop(f"l{i}.out")
        sizes[f"x{i + 1}"] = t * BF16
    n = cfg["layers"]
    head = rmsnorm("fn.", f"x{n}", B * L, H, "norm") + [
        op("logits", B * L * V * BF16, ["fn.out"], saves=["fn.out"], param="lm_head", flops=2 * B * L * H * V),
        op("logits32", B * L * V * F32, ["logits"]),
        op("logp", B * (L - 1) * V * F32, ["logits32"], saves=["out"]),
        op("loss", 4, ["logp", "labels"], saves=["labels"]),
    ]
    for o in head:
        sizes[o.name] = o.size
    saved = run_forward(w, head, env, keep={f"x{n}", "labels"}, grad=True)
    grads, param_grads = {"loss": w.alloc(4)}, {}
    run_backward(w, head, env, saved, grads, param_grads, param_sizes, sizes)
    for i in reversed(range(n)):  # recompute, then the layer's backward
        ops = layer_ops(i, f"x{i}", B, L, cfg)
        saved = run_forward(w, ops, env, keep={f"x{i}", "mask"}, grad=True)
        grads[f"l{i}.out"] = grads.pop(f"x{i + 1}")
        env[f"l{i}.out"] = env.pop(f"x{i + 1}")
        run_backward(w, ops, env, saved, grads, param_grads, param_sizes, sizes)
    w.free(grads.pop("x0"))  # the embedding's backward
    param_grads["embed"] = w.alloc(param_sizes["embed"])
    for name in ("x0", "mask", "ids", "labels", "loss"):
        if name in env:
            w.free(env.pop(name))
    for name, addr in list(env.items()):
        w.free(addr)
    for name, _ in params:  # AdamW (foreach): state at the first step, one sqrt temporary per parameter
        if name not in opt_state:
            opt_state[name] = (w.alloc(param_sizes[name]), w.alloc(param_sizes[name]))
    temps = [w.alloc(size) for _, size in params]
    for a in temps:
        w.free(a)
    for name, _ in params:  # zero_grad(set_to_none=True)
        if name in param_grads:
            w.free(param_grads.pop(name))
    w.synchronize()  # loss.item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="trace path (.gz compresses)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--min-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    cfg = dict(H=2048, I=5632, heads=32, kv=4, V=32000, layers=args.layers, B=args.batch)
    params = parameters(cfg)
    param_sizes = dict(params)
    opener = gzip.open if args.out.endswith(".gz") else open
    with opener(args.out, "wt") as out:
        w = trace_writer(out)
        for _, size in params:  # live for the whole run
            w.alloc(size)
        opt_state = {}
        for L in jobs.sequence_lengths(args.steps, args.min_tokens, args.max_tokens):
            step(w, cfg, L, params, opt_state, param_sizes)
    print(f"{args.out}: {w.rows} rows, {args.steps} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
