"""The model and data both services benchmarks run (services_bench.py
offload, services_zero3.py): a Llama decoder from a transformers config
(random weights, bf16) or, where transformers is missing, a torch.nn
decoder called the same way; the batches; a device synchronization.
"""
import contextlib


def build_model(args, torch):
    if args.model == "torch":
        return _torch_decoder(args, torch)
    import transformers
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                                      num_attention_heads=args.heads, num_key_value_heads=args.heads,
                                      max_position_embeddings=args.seq)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    # Initialized on the GPU where torch allows (2.0+): seconds instead of a
    # CPU initialization per variant, which services.sh's time limit feels.
    where = torch.device(args.device) if args.device == "cuda" and hasattr(torch.device, "__enter__") \
        else contextlib.nullcontext()
    with where:
        model = transformers.LlamaForCausalLM(config)
    model = model.to(device=args.device, dtype=dtype)
    model.config.use_cache = False
    return model


def _torch_decoder(args, torch):
    """A causal decoder from torch.nn alone, called as transformers' models are
    (model(input_ids=..., labels=...).loss): for checking the script where
    transformers is missing."""
    import types
    nn = torch.nn

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.hidden)
            self.model = types.SimpleNamespace()
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(args.hidden, args.heads, args.intermediate, dropout=0.0, batch_first=True,
                                           norm_first=True) for _ in range(args.layers))
            self.model.layers = self.layers
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)

        def trunk(self, input_ids):
            n = input_ids.shape[1]
            mask = torch.triu(torch.full((n, n), float("-inf"), device=input_ids.device), diagonal=1)
            h = self.embed(input_ids)
            for layer in self.layers:
                h = layer(h, src_mask=mask)
            return h

        def forward(self, input_ids, labels):
            logits = self.head(self.trunk(input_ids))
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, args.vocab), labels[:, 1:].reshape(-1))
            return types.SimpleNamespace(loss=loss)

        def gradient_checkpointing_disable(self):
            pass

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            raise SystemExit("--recompute needs --model llama")

    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return Decoder().to(device=args.device, dtype=dtype)


def batches(args, torch, steps):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g) for _ in range(steps)]


def synchronize(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()
