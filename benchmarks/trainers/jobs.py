"""The training jobs the trainer and capacity benchmarks run, by name.

build(name, torch) -> job: the model (on the current device), a batch maker,
its loss, the optimizer and whether the base is frozen. Random weights from
`transformers` / `torchvision` configs; nothing is downloaded. The same inputs
every run (fixed seeds), so runs of one job under different allocators
compute the same losses.

    gpt2m    GPT-2 medium (355M), fp32 weights + autocast, 128-512 tokens
    llama    Llama-shaped, 270M, fp32 weights + autocast, 128-768 tokens
    resnet   ResNet-50, images of 160-256 px
    declm    decoder LM of about 1.1B parameters (TinyLlama's shape), bf16
             weights, gradient checkpointing, 128-4096 tokens per step
    moe      mixture-of-experts LM (Mixtral-shaped, 8 experts, top-2), bf16,
             about 0.8B parameters, 128-2048 tokens
    frozen   a frozen 1.3B decoder (bf16, no gradients, no optimizer state)
             under a small trainable head (2 layers + vocabulary projection),
             128-4096 tokens: the fine-tuning case where a frozen model fills
             the device and the trainable part churns around it
"""
import random
from types import SimpleNamespace

NAMES = ["gpt2m", "llama", "resnet", "declm", "moe", "frozen"]


def sequence_lengths(steps, low, high, seed=1234):
    rng = random.Random(seed)
    return [rng.randrange(low, high + 1, 32) for _ in range(steps)]


def _causal_lm(transformers, torch, config, dtype=None):
    """AutoModelForCausalLM from config with eager attention (deterministic), its parameters created in dtype
    (through torch's default dtype, which every transformers version honours; a model built in fp32 and then
    converted would add a transient fp32 copy to the job's memory)."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        except TypeError:
            config._attn_implementation = "eager"
            model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype) if dtype is not None else model


def _token_batches(torch, vocab, batch, low, high):
    lengths = sequence_lengths(1000, low, high)
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        tokens = torch.randint(0, vocab, (batch, lengths[step]), generator=generator, device="cpu").cuda()
        return tokens, tokens
    return make_batch


def _enable_checkpointing(model):
    try:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    except TypeError:  # transformers before 4.35
        model.gradient_checkpointing_enable()
    model.config.use_cache = False


def _lm(name, torch):
    import transformers
    autocast = True
    if name == "gpt2m":  # 24 layers, 1024 wide, 16 heads
        config = transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50257)
        model, batch, low, high = _causal_lm(transformers, torch, config), 8, 128, 512
    elif name == "llama":  # RMSNorm, SwiGLU, RoPE, grouped-query attention
        config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                                          num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                                          max_position_embeddings=2048)
        model, batch, low, high = _causal_lm(transformers, torch, config), 8, 128, 768
    elif name == "declm":
        config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                          num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                          max_position_embeddings=4096)
        model, batch, low, high = _causal_lm(transformers, torch, config, torch.bfloat16), 2, 128, 4096
        _enable_checkpointing(model)
        autocast = False
    else:  # moe
        config = transformers.MixtralConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                                            num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                                            num_local_experts=8, num_experts_per_tok=2,
                                            max_position_embeddings=2048, output_router_logits=False)
        model, batch, low, high = _causal_lm(transformers, torch, config, torch.bfloat16), 4, 128, 2048
        autocast = False
    model.train()
    return SimpleNamespace(model=model, parameters=list(model.parameters()),
                           make_batch=_token_batches(torch, config.vocab_size, batch, low, high),
                           forward=lambda inputs, labels: model(input_ids=inputs, labels=labels).loss,
                           autocast=autocast, batch=batch)


def _frozen(torch):
    import transformers
    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                      num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                      max_position_embeddings=4096)
    base = _causal_lm(transformers, torch, config, torch.bfloat16).model  # the decoder without its LM head
    base.requires_grad_(False)
    base.eval()
    hidden = config.hidden_size
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        head = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                                   torch.nn.GELU(), torch.nn.Linear(hidden, config.vocab_size))
    finally:
        torch.set_default_dtype(previous)

    def forward(inputs, labels):
        with torch.no_grad():
            features = base(input_ids=inputs, use_cache=False).last_hidden_state
        logits = head(features[:, :-1]).float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    return SimpleNamespace(model=head, parameters=list(head.parameters()),
                           make_batch=_token_batches(torch, config.vocab_size, 4, 128, 4096),
                           forward=forward, autocast=False, batch=4)


def _resnet(torch):
    import torchvision

    class GlobalAveragePool(torch.nn.Module):
        # AdaptiveAvgPool2d has no deterministic backward on CUDA; a mean has.
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    model = torchvision.models.resnet50(num_classes=1000)
    model.avgpool = GlobalAveragePool()
    model.train()
    batch = 32
    sizes = [random.Random(99 + i).choice([160, 192, 224, 256]) for i in range(1000)]
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        images = torch.randn(batch, 3, sizes[step], sizes[step], generator=generator, device="cpu").cuda()
        labels = torch.randint(0, 1000, (batch,), generator=generator, device="cpu").cuda()
        return images, labels
    return SimpleNamespace(model=model, parameters=list(model.parameters()), make_batch=make_batch,
                           forward=lambda inputs, labels: torch.nn.functional.cross_entropy(model(inputs).float(),
                                                                                           labels),
                           autocast=True, batch=batch)


def build(name, torch):
    """The job `name` (one of NAMES), built on the current device (call under `with torch.device("cuda")`)."""
    if name not in NAMES:
        raise ValueError("unknown job %r (known: %s)" % (name, ", ".join(NAMES)))
    if name == "resnet":
        return _resnet(torch)
    if name == "frozen":
        return _frozen(torch)
    return _lm(name, torch)
