"""Model, batch, loss, advantage, optimizer and training-loop settings
(``[model]``, ``[batch]``, ``[loss]``, ``[advantage]``, ``[optim]``, ``[train]``).

Units and ranges: see ``agentrl.config.settings``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from agentrl.config.ranges import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    UnitInterval,
    fix,
)
from agentrl.config.section import _Section

LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj")
"""Every attention and MLP projection of a decoder layer: LoRA on all of them (MLP
included) is what matches full fine-tuning in "LoRA without regret"."""


class LoRAConfig(_Section):
    """Low-rank adapters on the native decoder (``[model.lora]``; absent: full fine-tuning).
    The base weights are frozen (no gradient, no AdamW state); checkpoints hold the
    adapter alone, in PEFT's format; weight syncs send only the adapter tensors."""

    rank: PositiveInt = 16
    """r, the adapters' inner width (each adapted W [out, in] gains B [out, r] @ A [r, in]);
    >= 1."""
    alpha: PositiveFloat = 32.0
    """The adapter's output is scaled by alpha / rank (PEFT's lora_alpha); > 0."""
    dropout: UnitInterval = 0.0
    """Dropout on each adapter's input in training forwards (never in scoring passes nor
    in the engines); [0, 1)."""
    target_modules: list[str] | str = msgspec.field(
        default_factory=lambda: list(LORA_DEFAULT_TARGETS))
    """Which linear layers get an adapter, as PEFT reads it: a list of names, each
    matching a module whose qualified name is it or ends in "." + it (``"q_proj"``,
    ``"mlp.down_proj"``), or one string, a regular expression the whole qualified name
    must match (``"model.layers.[0-3].self_attn.(q|v)_proj"``). Only decoder projections
    qualify (never embed_tokens or lm_head)."""
    train_embeddings: bool = False
    """Also train the token embeddings and the LM head in full. Only false is supported:
    adapter-only syncs and the adapter versions the engines keep need a frozen base."""


class ModelConfig(_Section):
    path: str = ""
    """Local Hugging Face folder (config.json, *.safetensors, tokenizer.json), as given or
    relative to the project; `agentrl plan` checks it holds all three. Nothing is
    downloaded. Empty: the trainer builds or reuses the tiny built-in checkpoint."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """COMPUTE dtype of training forwards/backwards and of the engines. Master weights,
    gradients, their reduction over ranks and the optimizer state are always float32
    (FSDP2 mixed precision); log-probs and the loss are float32. "auto": bfloat16 on a
    GPU (the varlen kernels need it), float32 on the CPU."""
    attention: Literal["auto", "varlen", "flash", "torch"] = "auto"
    """Varlen attention backend. "auto": torch's own varlen kernel
    (`torch.nn.attention.varlen`, flash kernels, nothing to build) on a GPU of compute
    capability 8.0+ in bf16/fp16, else the exact per-row PyTorch path (the run prints
    which and why). "varlen": that kernel or an error; "flash": flash-attn (the optional
    `agentrl[flash]` extra) or an error; "torch": the per-row path everywhere."""
    compile: bool = False
    """`torch.compile` the decoder layers' per-token work (norms, projections, rope, MLP;
    attention stays eager) for the training forward/backward and the built-in engine's
    forwards, with dynamic shapes: the first update (and the first prefill and decode)
    pays the compilation, typically tens of seconds; every later pack reuses it. Works
    with FSDP2, activation checkpointing and LoRA training; the same loss and gradients
    as eager to float rounding. A LoRA run's engine replicas stay eager (their adapter
    versions would recompile at every sync). Off: eager everywhere. Measured on a CPU
    (`python -m bench.train_step --compile --shapes large`, 8 layers, hidden 512, 128
    rows): 1.14x per update and 22% less peak memory at 8,192-token micro-batches, no
    speed-up at 2,048 (11% less memory); the GPU acceptance script prints its figure."""
    tool_format: Literal["auto", "hermes", "qwen3_coder", "llama3_json", "mistral", "harmony",
                         "deepseek_v3"] = "auto"
    """The tool-call format the model writes (docs/models.md): its parser reads the
    model's calls and its ``format_call`` writes ``demonstrate()`` calls, for every
    environment built without its own ``parser``. "auto": read from the checkpoint's chat
    template; the run prints the choice and what the template does to multi-turn rows."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra variables for the chat template, as transformers passes them, e.g.
    ``{enable_thinking = false}`` for Qwen3's non-thinking mode (docs/models.md says what
    each does to multi-turn rows). Empty: the template's defaults."""
    lora: LoRAConfig | None = None
    """``[model.lora]``: train low-rank adapters on the frozen base instead of every
    weight (docs/lora.md). None (no section): full fine-tuning."""


class BatchConfig(_Section):
    rollout_batch_size: PositiveInt = 8
    """Groups (prompts) per collection; >= 1."""
    n_samples_per_prompt: PositiveInt = 4
    """Rollouts per group, for environments that do not set their own group_size; >= 1."""
    global_batch_size: PositiveInt = 32
    """Rollouts per optimizer update (never rows: compaction does not change it); >= 1."""
    num_steps_per_rollout: PositiveInt | None = None
    """Optimizer updates per collection; >= 1. Derived when absent; checked when given."""
    max_tokens_per_microbatch: PositiveInt = 4096
    """Token budget of one packed micro-batch; >= 1, and `agentrl plan` refuses a budget
    below the longest possible row. Changes memory and speed, never the gradient."""
    share_prefixes: bool = True
    """Rows of one group that open with the same prompt hold it once in a training
    micro-batch, its keys and values attended by each row (`agentrl/shared_prefix.py`):
    the same loss and gradient (to float rounding) for less compute, often 2x less for
    GRPO's short completions. Only with the exact per-row attention (`model.attention`
    "torch", what a CPU runs); torch's varlen and flash-attn kernels compute every row's
    prompt. Changes speed, never the gradient."""
    token_multiple: PositiveInt | None = None
    """Each training micro-batch's token count, and the count of positions its LM head
    computes, are padded up to a multiple of this with masked tokens that train nothing,
    so that kernels built per shape are reused from step to step instead of built anew
    for every micro-batch (oneDNN builds one per matmul shape for bf16 on a CPU, 1 to
    2 ms each). None: 64 where kernels are built per shape (a CPU computing in bf16 or
    fp16), 1 elsewhere. Padding can take a micro-batch past max_tokens_per_microbatch by
    up to 2 × token_multiple − 1 tokens. Changes speed, never the gradient."""


SEQUENCE_LEVEL_AGGREGATIONS = (
    "sequence",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "bnpo",
    "grpo",
    "sample",
)


class LossConfig(_Section):
    aggregation: str = "token"
    """Only "token": every generated token weighs 1 / (generated tokens in the update)."""
    clip_eps_low: UnitInterval = 0.2
    """Lower clip of the policy ratio: ratios below 1 - clip_eps_low are clipped; [0, 1)."""
    clip_eps_high: UnitInterval = 0.28
    """Upper clip (DAPO's clip-higher): ratios above 1 + clip_eps_high are clipped; [0, 1)."""
    kl_coef: Annotated[NonNegativeFloat, fix("use 0 to disable the KL term")] = 0.0
    """Weight of the k3 KL estimate to the reference (initial) model; >= 0, 0 disables it."""
    tis_cap: Annotated[float, Meta(ge=1)] | None = 2.0
    """Cap of the truncated importance weight trainer/engine probability (a ratio); >= 1
    (a cap below 1 would shrink every token's weight); None disables."""
    old_logprobs: Literal["score", "engine"] = "score"
    """The ratio's old policy. "score": when a collection has several updates, the
    trainer's weights before the first one (its own forward, and a scoring pass of the
    later updates' rows); the engine's log-probs when it has one;
    "engine": always the engine's log-probs (no scoring pass; the mismatch enters the
    ratio, and tis_cap does not apply)."""
    objective: Literal["ppo", "decoupled"] = "ppo"
    """"ppo": clip around the old policy (above), the engine's log-probs as truncated-IS
    reference. "decoupled" (AReaL's decoupled PPO, for stale data): the old policy is the
    proximal one (the trainer's weights before the step: the first update's own forward,
    a scoring pass for the later updates' rows), the clip is around it, and the behaviour
    policy enters as the IS weight π_prox/π_engine; tokens whose weight passes tis_cap
    are left out of the gradient (AReaL's filter)."""
    relaxed_clip_eps_low: UnitInterval | None = None
    """Mu-GRPO's relaxed clipping: the lower clip for tokens generated by older weights
    (age >= 1, asynchronous collection); [0, 1); None: stale tokens clip like fresh ones."""
    relaxed_clip_eps_high: NonNegativeFloat | None = None
    """Upper clip for stale tokens (age >= 1); >= 0; None: clip_eps_high."""
    negative_advantage_veto: Annotated[float, Meta(gt=1)] | None = None
    """Mu-GRPO's negative-advantage veto, a ratio threshold τ > 1: in a row with a
    negative advantage, the first generated token whose π/π_engine leaves [1/τ, τ] and
    every generated token after it in the row get no gradient. None disables it."""
    summary_tokens: Literal["train", "mask"] = "train"
    """The generated tokens of a compaction summary (the policy's ``compact`` reply under
    ``compaction.strategy = "tool"``, or a ``summarize`` summary): "train" them like any
    generated token, or "mask" them (loss mask 0: no gradient flows through the summary,
    and the update's token count N leaves them out)."""


class AdvantageConfig(_Section):
    estimator: Literal["grpo", "rloo", "dr_grpo"] = "grpo"
    """Baseline within each group: mean (grpo, dr_grpo) or leave-one-out mean (rloo)."""
    scale_by_std: bool = False
    """grpo only: divide by the group's sample std (ddof=1, as verl, NeMo-RL and TRL) +
    1e-6; a group of one rollout gets advantage 0."""


class OptimConfig(_Section):
    lr: PositiveFloat = 1e-5
    """Peak AdamW learning rate (per optimizer update); a finite number > 0."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW decoupled weight decay (fraction of lr per update); >= 0."""
    betas: tuple[UnitInterval, UnitInterval] = (0.9, 0.999)
    """AdamW moment decay rates (per update); each in [0, 1)."""
    warmup_steps: NonNegativeInt = 0
    """Optimizer updates of linear warm-up from 0 to lr; >= 0."""
    max_grad_norm: Annotated[NonNegativeFloat, fix("use 0 to disable clipping")] = 1.0
    """Global gradient-norm clip (L2 norm); >= 0, 0 disables it."""
    lr_scaling: Literal["none", "sqrt"] = "none"
    """"sqrt": the peak lr becomes lr × sqrt(global_batch_size / lr_reference_batch), the
    square-root rule for Adam (see ``agentrl.config.schedule.effective_lr`` for where it holds)."""
    lr_reference_batch: PositiveInt | None = None
    """lr_scaling = "sqrt": the global_batch_size (rollouts per update) at which ``lr``
    was tuned; >= 1."""


class TrainConfig(_Section):
    num_steps: PositiveInt = 10
    """Training steps; one step is one collection and its num_steps_per_rollout updates;
    >= 1."""
    seed: Annotated[int, Meta(ge=0, lt=2**32)] = 0
    """Seed of every random generator (python, numpy, torch, the sampler, the engine);
    in [0, 2**32)."""
    checkpoint_every: Annotated[NonNegativeInt, fix("use 0 to checkpoint only at the end")] = 0
    """Steps between checkpoints; >= 0, 0: only at the end."""
    eval_every: Annotated[NonNegativeInt, fix("use 0 to disable validation")] = 0
    """Steps between validations on held-out tasks; >= 0, 0 disables them."""
    eval_tasks_per_env: PositiveInt = 16
    """Held-out tasks per environment in each validation; >= 1."""
    num_ranks: PositiveInt = 1
    """Data-parallel ranks on THIS machine, >= 1: a shortcut for `torchrun --standalone
    --nproc-per-node num_ranks -m agentrl train ...` (the same code path). Under torchrun
    (one or many machines) torchrun's process count decides and this must stay 1 or equal
    it. Rank 0 generates and broadcasts the rollouts; every rank trains on its share."""
    deterministic: bool = False
    """Results that do not depend on batching or timing, so a resume is bit-exact: the
    torch engine decodes batch-invariantly (every slot, whole span, every step) and a
    collection keeps groups in launch order. On a GPU also deterministic kernels
    (`torch.use_deterministic_algorithms`, which torch's flash-attention backward obeys;
    flash-attn's `deterministic=True`): an op without one then raises. Needs
    rollout.engine = "torch"; slower decoding (bench/batch_invariance.py). Off: a resume
    loses no rollout and trains none twice, counters and metrics continue exactly, and the
    weights continue from the checkpoint, but the samples after it may differ in the last
    bits (docs/resume.md)."""
    collective_timeout_s: PositiveFloat | None = None
    """Seconds any collective (all-reduce, all-gather, broadcast) may take before the job
    fails. None: derived above the rollout and validation budgets (see
    ``agentrl.parallel.timeouts``). Ranks never sit in a collective while rank 0 generates,
    validates or checkpoints; they wait with ``wait_for_rank0_timeout_s``."""
    wait_for_rank0_timeout_s: PositiveFloat | None = None
    """Seconds ranks 1..N wait (outside any collective) for rank 0 to finish a collection,
    a validation or a checkpoint. None: derived from the rollout and validation budgets."""
    max_invalid_fraction: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """Stop the run when more than this share of an environment's recent rollouts are
    invalid (judged over its newest steps holding at least 16 of its rollouts, kept or
    dropped; see ``agentrl.rollout.health``). In [0, 1]; 1.0 never stops."""
    activation_checkpointing: Literal["auto"] | bool = "auto"
    """Recompute each decoder layer in backward instead of keeping its activations: the
    layers then keep only their input (hidden_size values per token and layer) at the
    cost of about one more forward. "auto": on when training on a GPU, off on CPU;
    true / false force it. `agentrl plan --gpu-memory` shows what it saves."""
    logprob_chunk_tokens: PositiveInt = 1024
    """Positions per chunk when the training forward turns hidden states into log-probs
    (>= 1): the head's transient tensors are [chunk, vocabulary] (never [micro-batch,
    vocabulary])."""
    gradient_sync: Literal["update", "micro_batch"] = "update"
    """When gradients are reduce-scattered over the ranks (FSDP2): "update", once per
    optimizer update, after its last micro-batch (the ones before accumulate unsharded
    fp32 gradients: 4 bytes per parameter on every rank, which `agentrl plan` counts);
    "micro_batch", after every micro-batch (gradients stay sharded: less memory, one
    reduce-scatter of the whole model per micro-batch). Same gradient either way. One
    rank too: its reduce sends nothing, yet copies, scales and re-chunks every gradient
    (13% of an 8-layer CPU step when done at each micro-batch)."""
