"""Run configuration: the nested msgspec Structs, one per section, every field documented.

Loading (TOML, ``--set``) is ``agentrl.config.load``; the load-time checks are
``agentrl.config.checks``.

Every field says its unit and its range. Counts of the batch are in *rollouts*
(responses) or *groups*, never rows: a rollout that was compacted into several rows
still counts once. Ranges are part of the field types (``agentrl.config.ranges``: e.g.
``Probability`` is (0, 1]); every float must also be finite. A value outside its range
is refused at load time in one line naming the setting, the value, the range and the fix.
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
    Probability,
    UnitInterval,
    fix,
)


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: unknown keys are refused."""


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


class RolloutConfig(_Section):
    engine: Literal["torch", "vllm"] = "torch"
    """Inference engine: the built-in PyTorch engine (CPU) or vLLM (GPU, extra `gpu`)."""
    temperature: Annotated[NonNegativeFloat, fix("use 0 for greedy decoding")] = 1.0
    """Sampling temperature (logits are divided by it); >= 0, 0 is greedy."""
    top_p: Annotated[Probability, fix("use 1.0 to sample from the whole distribution")] = 1.0
    """Nucleus sampling: draw from the smallest set of tokens holding this probability
    mass; (0, 1], 1.0 keeps every token."""
    max_new_tokens: PositiveInt = 256
    """Generated tokens per turn; >= 1, and below the model's max_position_embeddings."""
    max_turns: PositiveInt = 8
    """Model turns per rollout; >= 1."""
    max_rollout_tokens: PositiveInt = 2048
    """Generated tokens of a rollout's main thread, over all its turns and segments; >= 1
    (subagent threads have max_subagent_tokens each). Without compaction a thread is one
    row, so prompt + this must fit the model's positions."""
    max_subagent_depth: NonNegativeInt = 1
    """Levels of subagents below the main thread (``@subagent`` tools): 1 lets the main
    thread start subagents, 2 lets those start their own, ...; >= 0. A call past it gets an
    error result (``subagent_failures/depth_limit``) and starts nothing; 0 turns them off."""
    max_subagents_per_rollout: NonNegativeInt = 8
    """Subagent threads one rollout may start, over all depths (threads, not calls
    refused); >= 0. Calls past it get an error result (``subagent_failures/count_limit``).
    Several calls of one turn run concurrently."""
    max_subagent_tokens: PositiveInt = 512
    """Generated tokens of one subagent thread, over its turns and segments; >= 1 (a
    ``@subagent(max_tokens=...)`` may lower it). A thread out of tokens returns an error
    result to its parent (``subagent_failures/max_tokens``). A rollout generates at most
    max_rollout_tokens + max_subagents_per_rollout x max_subagent_tokens tokens."""
    step_timeout_s: Annotated[PositiveFloat, fix("give a number of seconds > 0")] = 30.0
    """Seconds one environment call (reset, tool_schemas, step, close) may take before the
    rollout is marked invalid, counted from the call's own start (never time spent
    waiting for a worker); > 0. The constructor gets rollout_timeout_s."""
    rollout_timeout_s: Annotated[PositiveFloat, fix("give a number of seconds > 0")] = 600.0
    """Seconds one whole rollout may take; > 0."""
    max_concurrent_rollouts: PositiveInt = 64
    """Rollouts in flight at once (the torch engine's batch slots); >= 1."""
    max_retries: NonNegativeInt = 2
    """Extra attempts of a rollout that failed for infrastructure reasons (a server down
    or full, a disconnect, a worker that died, a replica out of service, a constructor or
    reset that raised, any failure before the policy generated a token; docs/robustness.md),
    each from the same task, in the same group, with a fresh environment; >= 0. Only when
    they run out is the rollout masked (``invalid/<kind>``) and its task named in a
    warning."""
    ambiguous_failures: Literal["mask", "retry", "keep"] = "mask"
    """A failure whose cause cannot be told (a step that raised or timed out after the
    policy acted, a rollout timeout, a contract broken after an action, ...): "mask"
    (invalid, counted), "retry" (as infrastructure) or "keep" (trained, with the reward
    earned so far or failure_rewards[kind])."""
    failure_rewards: dict[str, float] = {}
    """The reward a policy-caused failure trains with, by kind (``max_rollout_tokens``,
    ``context_budget``, ``max_compactions``, ``tool_errors``, ``harness_budget``, and with
    ambiguous_failures = "keep" the ambiguous kinds), e.g. ``{ max_rollout_tokens =
    -1.0 }``: a fixed penalty; a kind not listed keeps the environment's reward."""
    max_tool_errors: PositiveInt | None = None
    """Failed tool calls (malformed, unknown tool, bad arguments: the step's
    ``info["tool_errors"]``) a rollout may make; past it the rollout ends, truncated with
    reason "tool_errors" (a policy-caused failure: trained). None: no limit."""
    vllm_args: dict[str, Any] = {}
    """engine = "vllm": keyword arguments for ``VLLMEngine.from_pretrained`` and vLLM's
    engine args, e.g. ``{ gpu_memory_utilization = 0.5 }`` (the default: the trainer
    shares the GPU), ``enforce_eager``, ``kv_cache_memory_bytes``."""
    filter_uniform_groups: bool = False
    """Dynamic sampling: drop groups whose rewards are all equal and collect more."""
    max_extra_collections: NonNegativeInt = 4
    """With filter_uniform_groups: extra collection rounds before falling back to
    training on what was kept (with a warning); >= 0."""
    max_observation_chars: PositiveInt = 100_000
    """Characters of content one reset or step may return (all its messages together);
    >= 1. An environment that returns more breaks its contract: that rollout is invalid
    (``bad_observation``). Tools of an AgentEnv are cut well below it, with a marker."""
    num_engines: NonNegativeInt | None = None
    """Inference replicas the trainer starts itself (engines): each a TorchEngine with its
    own copy of the model, or a vLLM engine of tensor_parallel_size GPUs. Rollouts are
    spread over all replicas by load. None: 1, or 0 when remote_engines are given."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs per vLLM replica (tensor parallel); the built-in engine uses 1."""
    placement: Literal["colocated", "separate"] = "colocated"
    """Where local replicas run. "colocated": on the training GPUs (replica i on GPUs
    i·tp ...), asleep while the trainer trains (vLLM sleep mode; the built-in engine frees
    its KV cache), woken for the weight sync and generation. "separate": on GPUs of their
    own after the training GPUs (replica i on GPUs T + i·tp ..., T = training GPUs)."""
    sleep_level: Literal[1, 2] = 1
    """Colocated vLLM: 1 keeps a copy of the weights in host memory while asleep; 2 drops
    them (every sync sends all weights anyway; saves host memory)."""
    remote_engines: list[str] = []
    """Replicas served elsewhere, as base URLs ("http://10.0.0.2:8000"): `agentrl serve
    CONFIG` or `vllm serve` with the flags in docs/vllm.md. Driven token-in/token-out over
    HTTP; the trainer pushes its weights to them at start and after every step."""
    request_timeout_s: PositiveFloat = 600.0
    """Seconds one generation request to a remote replica may take; past it, or when the
    server cannot be reached, the rollout is invalid and the replica leaves service."""
    weight_transport: Literal["auto", "gloo", "nccl", "ipc", "files"] = "auto"
    """Data plane of weight syncs, through vLLM's weight-transfer API. "auto": CUDA IPC
    for vLLM colocated on the training GPUs, NCCL for vLLM on separate GPUs or servers,
    gloo on CPU and to `agentrl serve`. "files": the older safetensors-bucket path for vLLM
    builds without the weight-transfer API (local replicas only)."""
    weight_sync_host: str = ""
    """The trainer's address as remote replicas reach it (they join its gloo/NCCL
    rendezvous there); "" takes this machine's address on the route to each server."""
    weight_sync_bucket_mb: PositiveInt = 256
    """MiB of tensors per bucket of a weight sync (memory held at once while syncing)."""
    weight_sync_timeout_s: PositiveFloat = 300.0
    """Seconds each step of a weight sync (one bucket, start, finish) may take before the
    sync fails with an error naming the replica."""
    max_staleness: NonNegativeInt = 0
    """Policy versions (training steps) generation may run ahead of training. 0: the
    synchronous loop (collect, then train). k >= 1: later collections are generated while
    the trainer trains, by weights at most k steps older than the ones being trained;
    >= 0."""
    inflight_updates: bool = False
    """With max_staleness >= 1: new weights reach the engine between two decode steps and
    running rollouts continue under them (tokens record their version); otherwise the
    engine takes new weights only between collections."""
    collector: Literal["thread", "process"] = "thread"
    """With max_staleness >= 1, where the rollout side (engine replicas, environments,
    runner) runs. "thread": a thread of the trainer's process. "process": a process of its
    own, so that environment, tool and engine code never holds the trainer's interpreter
    lock nor takes its core; environment ids must then be importable (a module path or a
    registered id, not a class defined only in a running script's memory)."""


class CompactionConfig(_Section):
    strategy: Literal["none", "truncate", "drop_oldest", "summarize", "tool"] = "none"
    """What happens when a turn's context would pass max_context_tokens: "none" (no
    budget: the rollout is one row), "truncate" (the rollout ends there, truncated with
    reason "context_budget"), "drop_oldest" turns, a policy-written "summarize" (asked
    for when the budget is reached), or "tool": the policy is offered a `compact` tool
    whose argument is its own summary and compacts whenever it calls it; the budget still
    forces a compaction (`fallback`) when it has not compacted in time."""
    fallback: Literal["summarize", "drop_oldest", "truncate"] = "summarize"
    """strategy "tool": what the budget forces when the policy has not compacted in time."""
    max_context_tokens: PositiveInt = 2048
    """Context tokens (prompt + history) a turn may start from before compaction; >= 1,
    and max_context_tokens + rollout.max_new_tokens must fit the model's positions."""
    keep_last_turns: NonNegativeInt = 2
    """drop_oldest / summarize / tool: turns kept after the system and task messages (and
    the summary); >= 0. After a budget overflow the newest turn, with its tool result, is
    always kept, even with 0; a `compact` call keeps the last keep_last_turns turns
    before it."""
    max_compactions: NonNegativeInt = 4
    """Compactions per rollout (by tool and by budget together); >= 0; past it the
    rollout ends as truncated (reason "max_compactions")."""
    summary_max_tokens: PositiveInt = 128
    """summarize (and the tool strategy's summarize fallback): generated tokens for the
    summary; >= 1."""

    @property
    def asks_for_summary(self) -> bool:
        """Whether a budget overflow asks the policy for a summary (summarize, or the tool
        strategy with its summarize fallback)."""
        return self.strategy == "summarize" or (
            self.strategy == "tool" and self.fallback == "summarize")


class HarnessConfig(_Section):
    """An agent program trained through the OpenAI-compatible endpoint
    (docs/harnesses.md): give ``run`` or ``command``, not both."""

    run: str = ""
    """A Python callable ``run(task, client_config) -> str`` (the final answer), as
    "path/to/file.py:function" (relative to where agentrl runs or to the config's folder)
    or "package.module:function". ``task``: {"messages", "tools", "seed", "rollout_id"};
    ``client_config``: {"base_url", "api_key", "model"} for ``openai.OpenAI(...)``."""
    command: list[str] = []
    """Or a command line, run as a subprocess once per rollout with OPENAI_BASE_URL,
    OPENAI_API_KEY, OPENAI_MODEL and AGENTRL_TASK (the task as JSON, also on stdin) in its
    environment; its final answer is the file $AGENTRL_ANSWER_FILE when it writes one,
    else its stdout (stripped); a non-zero exit status invalidates the rollout."""
    isolation: Literal["thread", "process"] = "thread"
    """``run``: where the callable runs: a thread of this process, or a worker process
    killed at the deadline (as ``AgentEnv.isolation``)."""
    sandbox: bool = False
    """``command``: run it in a bubblewrap sandbox: the host's root read-only, a private
    /tmp (and empty /run, /var/tmp, ...), its working folder read-only, its own user, PID
    and network namespaces, no network but the endpoint and no Unix socket (a seccomp
    filter), within ``max_open_files`` and ``max_processes`` (docs/security.md)."""
    max_open_files: PositiveInt = 256
    """``command`` with ``sandbox``: file descriptors the program may hold (RLIMIT_NOFILE);
    >= 1. Its connections to the endpoint are capped at 64 at once besides."""
    max_processes: PositiveInt = 256
    """``command`` with ``sandbox``: processes and threads the program's uid may run in
    its sandbox (RLIMIT_NPROC; the forwarder's two threads per open connection count);
    >= 1."""
    cwd: str = ""
    """``command``: the working folder (relative to where agentrl runs); "": that folder."""
    env: dict[str, str] = {}
    """``command``: more environment variables (in the sandbox, its whole environment is
    these, PATH, HOME, LANG and the endpoint's)."""
    timeout_s: PositiveFloat | None = None
    """Seconds the program may run in one rollout before it is killed and the rollout is
    invalid (``harness_timeout``); > 0; None: rollout.rollout_timeout_s."""
    max_requests: PositiveInt | None = None
    """Requests per rollout, over all its threads; >= 1; past it requests are refused and
    the rollout is invalid (``harness_budget``). None: rollout.max_turns. Each request
    generates at most rollout.max_new_tokens, the rollout rollout.max_rollout_tokens."""
    grader: str = ""
    """"file.py:function" or "module:function" called as ``grader(task, final)`` with the
    environment's ``Task`` (its ``answer``, ...) → a reward or a ``Grade``; "": the
    environment's own ``grade(final)``."""


class EndpointConfig(_Section):
    """Where the endpoint for agent programs listens during training (harness
    environments only; `agentrl serve` serves the same routes on its own port)."""

    host: str = "127.0.0.1"
    """Address to listen on; programs on other machines need an address they reach."""
    port: NonNegativeInt = 0
    """TCP port; 0 picks a free one. The training endpoint's: a validation's endpoint
    always listens on a free port of ``host`` (the training one keeps this port)."""
    model_name: str = "policy"
    """The model name requests must give (client_config["model"], OPENAI_MODEL)."""


class EnvironmentConfig(_Section):
    id: str
    """A registered id ("agentrl/Countdown-v0") or "package.module:ClassName"; `agentrl
    plan` builds it once to check the id, its kwargs and its data files."""
    weight: Annotated[PositiveFloat, fix("give a relative weight such as 1.0; to leave "
                                         "an environment out, remove it")] = 1.0
    """Sampling weight (relative): this environment's share of each collection's groups;
    a finite number > 0."""
    group_size: PositiveInt | None = None
    """Rollouts per group for this environment; >= 1; defaults to
    batch.n_samples_per_prompt."""
    reward_scale: PositiveFloat = 1.0
    """Multiplies this environment's rewards before advantages; a finite number > 0 (0
    would erase the reward, a negative scale invert it)."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments for the environment's constructor."""
    name: str = ""
    """Short name in metrics; defaults to the id's last part."""
    harness: HarnessConfig | None = None
    """An agent program plays this environment's tasks through the OpenAI-compatible
    endpoint instead of the built-in loop; the environment gives the tasks (``reset``)
    and grades the program's final answer (``grade``). See docs/harnesses.md."""

    def display_name(self) -> str:
        """The name this environment has in metrics and reports."""
        if self.name:
            return self.name
        return self.id.split("/")[-1].split(":")[-1]


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


class WandbConfig(_Section):
    project: str
    """The Weights & Biases project the run is logged to."""
    entity: str = ""
    """Team or user owning the project; "" the account's default."""
    name: str = ""
    """Run name; "" the run folder's name."""
    group: str = ""
    """Group of runs it belongs to (e.g. a sweep); "" none."""
    tags: list[str] = []
    """Tags of the run."""
    mode: Literal["", "online", "offline", "disabled"] = ""
    """"offline" writes RUN_DIR/wandb/ only (upload later with `wandb sync`), "online" also
    streams it to the server; "" follows WANDB_MODE (online when unset)."""


class MlflowConfig(_Section):
    tracking_uri: str = ""
    """Where runs are stored: a server ("http://host:5000") or a database
    ("sqlite:///path/mlflow.db"); "" follows MLFLOW_TRACKING_URI, else
    sqlite:///RUN_DIR/mlflow.db (a local store, no server)."""
    experiment: str = "agentrl"
    """Experiment the run is logged under (created when missing)."""
    run_name: str = ""
    """Run name; "" the run folder's name."""


class CostsConfig(_Section):
    """A price table (``[log.costs]``; absent: seconds and tokens are logged, no cost).
    Each figure of a step is multiplied by its price and the products added up: the
    step's cost, per environment and overall (``cost/step``, ``cumulative/cost``,
    ``cost/per_reward_point``). Any currency; every price >= 0, default 0."""

    per_generation_second: NonNegativeFloat = 0.0
    """Price of one second of the engine's busy time (``cost/generation_seconds``: the
    seconds in which a request was in flight, shared among the requests then; with several
    replicas, the price of them all)."""
    per_env_second: NonNegativeFloat = 0.0
    """Price of one second of environment calls (``cost/env_seconds``)."""
    per_sandbox_second: NonNegativeFloat = 0.0
    """Price of one second of sandboxed runs (``cost/sandbox_seconds``), charged on top
    of ``per_env_second`` (those seconds are part of the environment calls)."""
    per_million_generated_tokens: NonNegativeFloat = 0.0
    """Price of a million tokens the engine generated (``cost/generated_tokens``)."""
    per_million_prompt_tokens: NonNegativeFloat = 0.0
    """Price of a million prompt tokens sent to the engine, the whole context of every
    request (``cost/prompt_tokens``)."""


class LogConfig(_Section):
    live: bool = True
    """Live terminal display during training."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run folder."""
    rollouts_every: NonNegativeInt = 1
    """Steps between rollout samples written to RUN_DIR/rollouts/step_NNNNNN.jsonl (per
    environment the best, the worst and a few random rollouts, decoded); >= 0; 0 disables."""
    rollouts_random_per_env: NonNegativeInt = 2
    """Rollouts per environment drawn at random (seeded by train.seed and the step) for
    each sample, besides the best and the worst; >= 0."""
    wandb: WandbConfig | None = None
    """Also log to Weights & Biases (extra `wandb`): every figure of metrics.jsonl at its
    step, the run config, and each rollout sample as a table. None: off."""
    mlflow: MlflowConfig | None = None
    """Also log to MLflow (extra `mlflow`): the same figures, the config (as parameters and
    config.json) and the rollout samples as tables. None: off."""
    costs: CostsConfig | None = None
    """A price table that turns each step's seconds and tokens into cost, per environment
    and per reward point (``[log.costs]``). None: seconds and tokens only."""


class Config(_Section):
    environments: list[EnvironmentConfig]
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)
    loss: LossConfig = msgspec.field(default_factory=LossConfig)
    advantage: AdvantageConfig = msgspec.field(default_factory=AdvantageConfig)
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    compaction: CompactionConfig = msgspec.field(default_factory=CompactionConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    endpoint: EndpointConfig = msgspec.field(default_factory=EndpointConfig)

    def group_size(self, env: EnvironmentConfig) -> int:
        """Rollouts per group for one environment."""
        return env.group_size if env.group_size is not None else self.batch.n_samples_per_prompt


def num_local_engines(rollout: RolloutConfig) -> int:
    """Replicas the trainer starts: num_engines, or its default (1; 0 with servers)."""
    if rollout.num_engines is not None:
        return rollout.num_engines
    return 0 if rollout.remote_engines else 1
