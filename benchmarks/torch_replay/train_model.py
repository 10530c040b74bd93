#!/usr/bin/env python3
"""A few training steps of a real model architecture, for recording traces.

Run under tools/record_trace.py, which writes the allocations as fragctl CSV:

    python3 tools/record_trace.py --out llama.trace.csv.gz -- \\
        benchmarks/torch_replay/train_model.py --model llama --steps 4

Models (random weights, random data, nothing downloaded):

* llama: transformers' LlamaForCausalLM from a LlamaConfig (16 layers, width
  2048, MLP 5632, 16 heads, vocabulary 32000: about 1.1 B parameters), batch 4,
  sequence length drawn per step from 256..2048 (multiples of 128).
* vit: torchvision's vit_b_16, batch 128 at 224x224.

bf16 autocast, fused-free AdamW (foreach), zero_grad(set_to_none=True), as a
plain training loop does. Exits 3 when the model's package is missing.
"""

from __future__ import annotations

import argparse
import random
import sys


def build(model: str, device):
    import torch

    if model == "llama":
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError:
            print("train_model: transformers is not installed", file=sys.stderr)
            sys.exit(3)
        config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                             num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                             max_position_embeddings=2048)
        with device:
            net = LlamaForCausalLM(config)
        vocab = config.vocab_size

        def batch(rng: random.Random):
            seq = 128 * rng.randrange(2, 17)
            ids = torch.randint(0, vocab, (4, seq), device=device)
            return {"input_ids": ids, "labels": ids}

        def loss_of(out):
            return out.loss

        return net, batch, loss_of
    if model == "vit":
        try:
            import torchvision
        except ImportError:
            print("train_model: torchvision is not installed", file=sys.stderr)
            sys.exit(3)
        net = torchvision.models.vit_b_16().to(device)

        def batch(rng: random.Random):
            return {"x": torch.randn(128, 3, 224, 224, device=device),
                    "y": torch.randint(0, 1000, (128,), device=device)}

        def loss_of(out):
            return out

        class wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, x, y):
                return torch.nn.functional.cross_entropy(self.net(x).float(), y)

        return wrapped(), batch, loss_of
    raise SystemExit(f"train_model: unknown model {model}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["llama", "vit"], default="llama")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    import torch

    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    device = torch.device("cuda")
    net, batch, loss_of = build(a.model, device)
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)
    for step in range(a.steps):
        inputs = batch(rng)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(net(**inputs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"train_model: {a.model} step {step + 1}/{a.steps}: loss {loss.item():.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
