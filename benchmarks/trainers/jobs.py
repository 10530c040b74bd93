"""The training jobs the trainer and capacity benchmarks run, by name.

build(name, torch[, fixed_shapes]) -> job: the model (on the current device),
a batch maker, its loss, the optimizer and whether the base is frozen. Random weights from
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
    t5       encoder-decoder (T5 v1.1-large's shape, about 0.78B parameters,
             bf16, dropout 0.1), batch 4, source 128-1024 and target
             32-256 tokens, each drawn per step
    lora     LoRA (peft, rank 16 on every projection, dropout 0.05, fp32
             adapters) on a frozen 1.1B Llama (TinyLlama's shape, bf16) with
             gradient checkpointing, one sequence of 256-8192 tokens a step
    vit      ViT-L/16 (timm's vit_large_patch16_224 with dynamic_img_size:
             the position embedding resampled to each size), fp32 weights +
             autocast, batch 16, images of 160-384 px drawn per step; the
             position embedding is frozen (the resampling's backward,
             bicubic, has no deterministic CUDA kernel)
    kvgen    KV-cache generation, inference only: a 1.3B decoder of
             Llama-3.2-1B's shape with 32 KV heads (128 KiB of cache per
             token; bf16, eager attention), greedy decoding with
             transformers' cache (DynamicCache, grown token by token) in a
             loop of our own; per step one request of 1-32 prompts of
             64-2048 tokens (at most 32,768 prompt tokens) and 16-64 new
             tokens. Its "loss" is the mean of the last step's logits
             (float64), compared bit for bit as the trainers' losses are

With fixed_shapes every batch takes the shape of the job's first draw (its
sequence length, image size, request): a job whose shapes repeat, the case
where the arena's plan is to make no driver call once the job repeats.

A job is a namespace: model, parameters (those the optimizer steps; none for
an inference job), make_batch(step) -> (inputs, labels), forward(inputs,
labels) -> a scalar tensor, autocast (bf16 autocast around forward), batch,
train (absent: True; False: no backward and no optimizer, forward under
no_grad) and, for the four jobs above, shape(step) -> the step's shape as a
dict. The draws are pure Python (the functions below), the same every run.
transformers, torchvision, peft and timm are imported by the job that needs
them, when it is built.
"""
import random
from types import SimpleNamespace

NAMES = ["gpt2m", "llama", "resnet", "declm", "moe", "frozen", "t5", "lora", "vit", "kvgen"]

# The draws of the jobs with variable shapes (pure Python, tested in tests/python/test_trainer_jobs.py).
T5_SOURCE = (128, 1024)  # tokens, inclusive
T5_TARGET = (32, 256)
LORA_TOKENS = (256, 8192)
VIT_SIZES = (160, 384)  # pixels, multiples of 32 (of the patch, 16)
KVGEN_BATCHES = (1, 2, 4, 8, 16, 32)
# Batches each job draws up front (sequence lengths, image sizes, requests): make_batch(i) takes i below it.
BATCHES = 1000
KVGEN_PROMPT = (64, 2048)
KVGEN_NEW_TOKENS = (16, 64)  # one forward per token: 256 made a step take about 10 s on an H100
KVGEN_PREFILL_TOKENS = 32768  # batch x prompt at most


def _drawn(draws, fixed):
    """A job's per-batch draws, or with fixed its first draw for every batch (a job whose shapes repeat)."""
    return [draws[0]] * len(draws) if fixed else draws


def sequence_lengths(steps, low, high, seed=1234):
    rng = random.Random(seed)
    return [rng.randrange(low, high + 1, 32) for _ in range(steps)]


def source_target_lengths(steps, seed=4321):
    """t5's draw: per step (source tokens, target tokens), each drawn on its own, multiples of 32 from the low."""
    rng = random.Random(seed)
    return [(rng.randrange(T5_SOURCE[0], T5_SOURCE[1] + 1, 32), rng.randrange(T5_TARGET[0], T5_TARGET[1] + 1, 32))
            for _ in range(steps)]


def image_sizes(steps, seed=5678):
    """vit's draw: per step the image side in pixels (square images), a multiple of 32 in VIT_SIZES."""
    rng = random.Random(seed)
    return [rng.randrange(VIT_SIZES[0], VIT_SIZES[1] + 1, 32) for _ in range(steps)]


def generation_requests(steps, seed=8765):
    """kvgen's draw: per step a request (batch, prompt tokens, new tokens): the batch of KVGEN_BATCHES, the prompt
    a multiple of 32 from KVGEN_PROMPT's low with batch x prompt at most KVGEN_PREFILL_TOKENS, new tokens a multiple
    of 16 in KVGEN_NEW_TOKENS."""
    rng = random.Random(seed)
    requests = []
    for _ in range(steps):
        batch = rng.choice(KVGEN_BATCHES)
        prompt = rng.randrange(KVGEN_PROMPT[0], min(KVGEN_PROMPT[1], KVGEN_PREFILL_TOKENS // batch) + 1, 32)
        requests.append((batch, prompt, rng.randrange(KVGEN_NEW_TOKENS[0], KVGEN_NEW_TOKENS[1] + 1, 16)))
    return requests


def greedy_decode(torch, model, prompt, new_tokens):
    """Greedy decoding as model.generate does it, in a loop of our own (no generation config, no stop at an
    end-of-sequence token, which random weights would emit at random): the prompt's forward fills the model's
    KV cache (transformers creates a DynamicCache when use_cache is on and none is passed), then one forward per
    new token feeds the last token with the cache; the sequence grows by one column per token as generate's
    does. Only the last position's logits are computed (logits_to_keep=1). Returns (sequence, the logits of the
    last step)."""
    sequence, cache, step_input = prompt, None, prompt
    for _ in range(new_tokens):
        out = model(input_ids=step_input, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1]
        step_input = logits.argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, step_input], dim=1)
    return sequence, logits


def _from_config(transformers, torch, config, dtype=None, auto="AutoModelForCausalLM", attention="eager"):
    """transformers.<auto>.from_config(config) with that attention (eager: deterministic), its parameters created
    in dtype (through torch's default dtype, which every transformers version honours; a model built in fp32 and
    then converted would add a transient fp32 copy to the job's memory)."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        try:
            model = getattr(transformers, auto).from_config(config, attn_implementation=attention)
        except TypeError:
            config._attn_implementation = attention
            model = getattr(transformers, auto).from_config(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype) if dtype is not None else model


def _causal_lm(transformers, torch, config, dtype=None):
    """An AutoModelForCausalLM from config, eager attention, parameters in dtype (_from_config)."""
    return _from_config(transformers, torch, config, dtype)


def _token_batches(torch, vocab, batch, low, high, fixed):
    lengths = _drawn(sequence_lengths(BATCHES, low, high), fixed)
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


def _lm(name, torch, fixed):
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
                           make_batch=_token_batches(torch, config.vocab_size, batch, low, high, fixed),
                           forward=lambda inputs, labels: model(input_ids=inputs, labels=labels).loss,
                           autocast=autocast, batch=batch)


def _frozen(torch, fixed):
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
                           make_batch=_token_batches(torch, config.vocab_size, 4, 128, 4096, fixed),
                           forward=forward, autocast=False, batch=4)


def _resnet(torch, fixed):
    import torchvision

    class GlobalAveragePool(torch.nn.Module):
        # AdaptiveAvgPool2d has no deterministic backward on CUDA; a mean has.
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    model = torchvision.models.resnet50(num_classes=1000)
    model.avgpool = GlobalAveragePool()
    model.train()
    batch = 32
    sizes = _drawn([random.Random(99 + i).choice([160, 192, 224, 256]) for i in range(BATCHES)], fixed)
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        images = torch.randn(batch, 3, sizes[step], sizes[step], generator=generator, device="cpu").cuda()
        labels = torch.randint(0, 1000, (batch,), generator=generator, device="cpu").cuda()
        return images, labels
    return SimpleNamespace(model=model, parameters=list(model.parameters()), make_batch=make_batch,
                           forward=lambda inputs, labels: torch.nn.functional.cross_entropy(model(inputs).float(),
                                                                                           labels),
                           autocast=True, batch=batch)


def _t5(torch, fixed):
    import transformers
    # T5 v1.1-large's shape (gated GELU, untied embeddings); the ids of pad, end and decoder start are T5's.
    config = transformers.T5Config(vocab_size=32128, d_model=1024, d_kv=64, d_ff=2816, num_layers=24,
                                   num_decoder_layers=24, num_heads=16, feed_forward_proj="gated-gelu",
                                   tie_word_embeddings=False, dropout_rate=0.1, pad_token_id=0, eos_token_id=1,
                                   decoder_start_token_id=0, use_cache=False)
    model = _from_config(transformers, torch, config, torch.bfloat16, auto="AutoModelForSeq2SeqLM")
    model.config.use_cache = False
    model.train()
    batch = 4
    lengths = _drawn(source_target_lengths(BATCHES), fixed)
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        source, target = lengths[step]
        inputs = torch.randint(2, config.vocab_size, (batch, source), generator=generator, device="cpu").cuda()
        labels = torch.randint(2, config.vocab_size, (batch, target), generator=generator, device="cpu").cuda()
        return inputs, labels
    # With labels and no decoder inputs, T5 shifts the labels right behind the decoder start token.
    return SimpleNamespace(model=model, parameters=list(model.parameters()), make_batch=make_batch,
                           forward=lambda inputs, labels: model(input_ids=inputs, labels=labels).loss,
                           autocast=False, batch=batch,
                           shape=lambda step: {"source_tokens": lengths[step][0], "target_tokens": lengths[step][1]})


def _lora(torch, fixed):
    import peft
    import transformers
    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                      num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                      max_position_embeddings=LORA_TOKENS[1])
    base = _causal_lm(transformers, torch, config, torch.bfloat16)
    _enable_checkpointing(base)
    base.requires_grad_(False)
    adapters = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"])
    model = peft.get_peft_model(base, adapters)  # adapters in fp32 (autocast_adapter_dtype), the base frozen
    model.train()
    lengths = _drawn(sequence_lengths(BATCHES, *LORA_TOKENS), fixed)
    return SimpleNamespace(model=model, parameters=[p for p in model.parameters() if p.requires_grad],
                           make_batch=_token_batches(torch, config.vocab_size, 1, *LORA_TOKENS, fixed),
                           forward=lambda inputs, labels: model(input_ids=inputs, labels=labels).loss,
                           autocast=False, batch=1, shape=lambda step: {"tokens": lengths[step]})


def _vit(torch, fixed):
    import timm
    model = timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=1000, dynamic_img_size=True)
    for module in model.modules():  # eager attention: deterministic, as the other jobs' (no fused SDPA backward)
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    # The position embedding is resampled (bicubic, antialiased) to every size but the 224 px it was made for;
    # that resampling's backward has no deterministic CUDA kernel (atomicAdd), so the embedding is not trained.
    model.pos_embed.requires_grad_(False)
    model.train()
    batch = 16
    sizes = _drawn(image_sizes(BATCHES), fixed)
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        images = torch.randn(batch, 3, sizes[step], sizes[step], generator=generator, device="cpu").cuda()
        labels = torch.randint(0, 1000, (batch,), generator=generator, device="cpu").cuda()
        return images, labels
    return SimpleNamespace(model=model, parameters=[p for p in model.parameters() if p.requires_grad],
                           make_batch=make_batch,
                           forward=lambda inputs, labels: torch.nn.functional.cross_entropy(model(inputs).float(),
                                                                                           labels),
                           autocast=True, batch=batch, shape=lambda step: {"image_px": sizes[step]})


def _kvgen(torch, fixed):
    import transformers
    # Llama-3.2-1B's shape (tied embeddings, 128k vocabulary) but with a key and value head per query head (32 of
    # 64): 128 KiB of cache per token, four times Llama-3.2-1B's, so that the cache weighs beside the 2.7 GB of
    # weights. Eager attention, as the other jobs: under SDPA two native runs on an H100 (torch 2.11) gave logits
    # that differed from the first request on, so no set-up could be compared with native bit for bit.
    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                      num_attention_heads=32, num_key_value_heads=32, vocab_size=128256,
                                      tie_word_embeddings=True,
                                      max_position_embeddings=KVGEN_PROMPT[1] + KVGEN_NEW_TOKENS[1])
    model = _from_config(transformers, torch, config, torch.bfloat16)
    model.requires_grad_(False)
    model.eval()
    model.config.use_cache = True
    requests = _drawn(generation_requests(BATCHES), fixed)
    generator = torch.Generator(device="cpu").manual_seed(7)

    def make_batch(step):
        batch, prompt, new_tokens = requests[step]
        tokens = torch.randint(0, config.vocab_size, (batch, prompt), generator=generator, device="cpu").cuda()
        return tokens, new_tokens  # the "labels" of a generation step: how many tokens to generate

    def forward(prompt, new_tokens):
        _, logits = greedy_decode(torch, model, prompt, new_tokens)
        return logits.double().mean()
    return SimpleNamespace(model=model, parameters=[], make_batch=make_batch, forward=forward, autocast=False,
                           batch=None, train=False,
                           shape=lambda step: dict(zip(("batch", "prompt_tokens", "new_tokens"), requests[step])))


BUILDERS = {"resnet": _resnet, "frozen": _frozen, "t5": _t5, "lora": _lora, "vit": _vit, "kvgen": _kvgen}


def build(name, torch, fixed_shapes=False):
    """The job `name` (one of NAMES), built on the current device (call under `with torch.device("cuda")`).
    Imports what the job needs (transformers, torchvision, peft, timm) here, not at module load. With
    fixed_shapes every batch has the shape of the job's first draw."""
    if name not in NAMES:
        raise ValueError("unknown job %r (known: %s)" % (name, ", ".join(NAMES)))
    if name in BUILDERS:
        return BUILDERS[name](torch, fixed_shapes)
    return _lm(name, torch, fixed_shapes)
