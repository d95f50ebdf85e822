"""Warm start: supervised training on demonstrations played through the real rollout code.

A tiny model from random weights never produces a well-formed tool call, so RL has no
signal. The fix is a short supervised phase on correct demonstrations of every
environment of the config (:mod:`agentrl.envs.demonstrations`: each environment's scripted
``demonstrate`` policy or a JSONL of trajectories), played through the ordinary rollout
runner so every row has exactly the token layout RL will see; the loss is the RL loss's
token-level normalization applied to cross-entropy on the generated tokens.
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import torch

from agentrl.config import Config
from agentrl.envs.demonstrations import Policy, Trajectory, demonstration_policies
from agentrl.packing import collate, pack
from agentrl.reassembler import to_rows
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.rollout.template_check import prepare_chat
from agentrl.train.update import target_scores
from agentrl.types import Rollout, Row

# --------------------------------------------------------------------------- training


def sft_step(model: torch.nn.Module, rows: list[Row], optimizer: torch.optim.Optimizer,
             max_tokens: int) -> float:
    """One optimizer step of token-level cross-entropy on the rows' generated tokens.

    Normalized like the RL loss: each generated token weighs 1 / (generated tokens in the
    step), whatever the packing. Returns the mean loss per token. The forward is the RL
    update's (:func:`agentrl.train.update.target_scores`): the LM head and the last
    layer's MLP run only at the generated tokens, no entropy, row bounds read on the host;
    the loss is summed on the device and read back once.
    """
    ones = [1.0] * len(rows)
    batches = [collate(rows, ones, mb) for mb in pack([len(r.token_ids) for r in rows],
                                                      max_tokens)]
    num_tokens = max(sum(mb.num_tokens for mb in batches), 1)
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for mb in batches:
        mb = mb.to(device)
        logprobs = target_scores(model, mb, with_entropy=False).logprobs
        loss = -(logprobs * mb.loss_mask).sum() / num_tokens
        loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(total)


def sft_lr(step: int, num_steps: int, peak: float, warmup_steps: int,
           schedule: str = "cosine") -> float:
    """Learning rate of SFT step ``step`` (0-based): linear warm-up to ``peak``, then decay
    to 0 at the last step (``"cosine"`` or ``"linear"``) or stay flat (``"constant"``).

    Why: with a constant lr the final iterate is noisy, so the warm start's quality swung a
    lot between settings; decaying to ~0 makes the end point stable (and better).
    """
    if schedule not in _SCHEDULES:
        raise ValueError(f"unknown SFT lr schedule {schedule!r}: use one of {_SCHEDULES}")
    if step < warmup_steps:
        return peak * (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return peak
    span = max(num_steps - 1 - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    if schedule == "linear":
        return peak * (1.0 - progress)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


_SCHEDULES = ("cosine", "linear", "constant")

# --------------------------------------------------------------------------- warm start


class WarmStartConfig(msgspec.Struct, kw_only=True):
    """How to build and train a warm-start checkpoint."""

    num_steps: int = 300
    """Optimizer steps of supervised training. The defaults (300 steps of 16 rows, 800
    demonstrations, peak lr 1e-3 with a 10-step warm-up and cosine decay) are the one
    recipe for a new environment from the generic base (``docs/base-model.md``); the
    shipped per-environment assets were made with the flags their configs record."""
    rows_per_step: int = 16
    num_demonstrations: int = 800
    """Demonstration rollouts played (each environment by its weight)."""
    lr: float = 1e-3
    """Peak learning rate."""
    lr_schedule: str = "cosine"
    """After warm-up: "cosine" or "linear" decay to 0 at the last step, or "constant".
    Decaying to ~0 makes the end point stable; a pretrained base keeps its skills under
    a small decaying lr."""
    warmup_steps: int = 10
    hidden_size: int = 128
    """Tiny model width, when no model.path is given."""
    num_layers: int = 2
    vocab_size: int = 1024
    copy_steps: int = 0
    """Steps of copy pretraining (``agentrl.train.copy_pretrain``) before the
    demonstrations, for a tiny model from random weights that must carry facts (a
    tool's result, an entry across a compaction): ~2,000 steps form the circuit."""
    copy_lr: float = 1e-3
    recall_rows: int = 0
    """Recall rows (``agentrl.curriculum.recall``: facts, then questions answered by name,
    the loss on the answers) added to every step beside the demonstrations: dense practice
    of lookup, copy and sum, for building a base."""
    keyed_steps: int = 0
    """Steps of keyed recall after the copy steps (``agentrl.train.copy_pretrain``:
    lookup of a value a few tokens after its key); only with ``copy_steps``."""
    copy_rows: int = 0
    """N copy rows and N keyed recall rows (the copy stage's tasks, on random tokens)
    added to every step beside the demonstrations, so that the demonstrations' fixed
    layout does not overwrite the circuits the copy stage formed."""
    strategies: list[str] = []
    """Compaction strategies to play the demonstrations under, each an equal share (e.g.
    ["tool", "summarize"]: one warm start that knows both); empty: the config's."""
    compact_share: float = 1.0
    """Strategy "tool": the share of demonstrations that call ``compact`` themselves
    (where the environment's ``demonstrate_summary`` says); the others leave compaction
    to the budget's fallback. Below 1, a weaker demonstrator: its warm start compacts only
    sometimes, and RL can teach it when to."""
    chat_template: str = "compact"
    """The new tiny model's chat template: "compact" (one line per tool, the default: a
    new environment's small context budget then holds the task and a turn or two), or
    "qwen2.5" (Qwen2.5's ~150-token tool preamble)."""
    seed: int = 0


def tokenizer_corpus(config: Config, num_rollouts: int = 300,
                     policies: dict[str, Policy] | None = None,
                     chat_template: str = "qwen2.5") -> list[str]:
    """Text of demonstration episodes, so the tiny tokenizer has merges for the task text
    (prompts of a few hundred tokens instead of over a thousand)."""
    from agentrl.model import build_tiny_checkpoint, load_tokenizer
    from agentrl.model.tiny import default_corpus

    extra = compaction_texts(config) * 300
    # the bootstrap tokenizer makes long prompts and messages: no compaction and no token
    # limits, so no episode is cut short
    config = msgspec.structs.replace(
        config, compaction=msgspec.structs.replace(config.compaction, strategy="none"),
        rollout=msgspec.structs.replace(config.rollout, max_rollout_tokens=4096,
                                        max_new_tokens=4096))
    with tempfile.TemporaryDirectory() as tmp:
        bootstrap = load_tokenizer(build_tiny_checkpoint(Path(tmp) / "bootstrap",
                                                         chat_template=chat_template))
        rollouts = asyncio.run(play_demonstrations(config, bootstrap, num_rollouts, seed=12345,
                                                   policies=policies))
        texts = [bootstrap.decode(s.token_ids) for r in rollouts for s in r.segments]
    return list(default_corpus(0)) + texts * 3 + extra


def compaction_texts(config: Config) -> list[str]:
    """The text compaction adds to contexts (the drop marker, the ``compact`` tool's
    schema, the summary request), which the corpus's uncompacted episodes never show."""
    import json

    from agentrl.rollout.compact_tool import COMPACT_SCHEMA
    from agentrl.rollout.compaction import SUMMARY_PREFIX, SUMMARY_REQUEST, marker_message

    compaction = config.compaction
    texts = [marker_message(n)["content"] for n in range(1, 10)]
    if compaction.strategy in ("none", "truncate"):
        return []
    if compaction.strategy == "tool":
        texts.append(json.dumps(COMPACT_SCHEMA))
    if compaction.asks_for_summary:
        texts += [SUMMARY_REQUEST, SUMMARY_PREFIX]
    return texts


def under_strategies(config: Config, strategies: list[str]) -> list[Config]:
    """The config once per compaction strategy (itself when ``strategies`` is empty)."""
    import typing

    from agentrl.config import CompactionConfig, ConfigError

    known = typing.get_args(typing.get_type_hints(CompactionConfig)["strategy"])
    for strategy in strategies:
        if strategy not in known:
            raise ConfigError(f"--strategies: unknown compaction strategy {strategy!r}; "
                              f"choose among {', '.join(known)}")
    return [msgspec.structs.replace(config, compaction=msgspec.structs.replace(
        config.compaction, strategy=s)) for s in strategies] or [config]


def demonstrations_under(config: Config, ws: WarmStartConfig, tokenizer: Any,
                         policies: dict[str, Policy], log: Callable[[str], None],
                         played: list[Rollout] | None = None) -> list[Rollout]:
    """Correct demonstrations, ``ws.num_demonstrations`` split evenly over the strategies
    of ``ws.strategies`` (the config's own when empty); ``played``: see
    ``play_demonstrations``."""
    configs = under_strategies(config, ws.strategies)
    rollouts: list[Rollout] = []
    for index, each in enumerate(configs):
        if len(configs) > 1:
            log(f"compaction.strategy = {each.compaction.strategy!r}:")
        rollouts += asyncio.run(play_demonstrations(
            each, tokenizer, ws.num_demonstrations // len(configs), ws.seed + index,
            policies=policies, log=log, compact_share=ws.compact_share, played=played))
    return rollouts


def starting_point(config: Config, ws: WarmStartConfig, base: str | None, folder: Path,
                   policies: dict[str, Policy], log: Callable[[str], None] = print) -> Path:
    """The model folder a warm start begins from: ``base``, else a new tiny model (written
    under ``folder``) whose tokenizer is fitted to the demonstrations' text, or for
    ``base == "curriculum"`` one also pretrained on the drills
    (:mod:`agentrl.curriculum.fitted_base`). ``agentrl check-env`` measures and plays
    with its tokenizer, so both see the same tokens."""
    from agentrl.curriculum.fitted_base import CURRICULUM, curriculum_config, curriculum_stage

    if base == CURRICULUM:  # a new model, trained on the drills with these environments
        mix = curriculum_config(config)
        mix_policies = curriculum_policies(config, mix, policies)
        stage = curriculum_stage(ws)
        log(f"curriculum base: {stage.copy_steps} copy steps, then {stage.num_steps} steps "
            f"of the drills with the environments at a small share")
        start = new_model(mix, ws, folder, mix_policies)
        return warm_start(mix, folder / "curriculum", stage, base=str(start), log=log,
                          policies=mix_policies)
    if base:
        return Path(base)
    return new_model(config, ws, folder, policies)


def curriculum_policies(config: Config, mix: Config, policies: dict[str, Policy]
                        ) -> dict[str, Policy]:
    """The demonstration sources of ``mix`` (``curriculum_config(config)``): the config's
    own, built already, and the drills' beside them."""
    drills = [e for e in mix.environments if e not in config.environments]
    return {**policies, **demonstration_policies(
        msgspec.structs.replace(mix, environments=drills))}


def new_model(config: Config, ws: WarmStartConfig, folder: Path,
              policies: dict[str, Policy]) -> Path:
    """A new tiny model under ``folder``, its tokenizer fitted to the config's
    demonstrations (each environment in its weight's share)."""
    from agentrl.model import build_tiny_checkpoint

    return build_tiny_checkpoint(
        folder / "base", hidden_size=ws.hidden_size, num_layers=ws.num_layers,
        num_heads=max(1, ws.hidden_size // 32), num_kv_heads=max(1, ws.hidden_size // 64),
        vocab_size=ws.vocab_size, corpus=[text for each in under_strategies(
            config, ws.strategies) for text in tokenizer_corpus(
            each, policies=policies, chat_template=ws.chat_template)],
        seed=ws.seed, chat_template=ws.chat_template)


def warm_start(config: Config, out: str | Path, ws: WarmStartConfig, base: str | None = None,
               log: Callable[[str], None] = print,
               trajectories: dict[str, list[Trajectory]] | None = None,
               policies: dict[str, Policy] | None = None) -> Path:
    """Load ``base`` (or build a new tiny model), train it on demonstrations of every
    environment of the config (``trajectories``: from JSONL files, by environment name;
    ``policies``: every environment's source, built already), save an HF folder to
    ``out``. Refuses first when an environment has no demonstrations."""
    from agentrl.model import load_pretrained, load_tokenizer, save_pretrained
    from agentrl.train.checkpoint import copy_tokenizer_files

    sft_lr(0, ws.num_steps, ws.lr, ws.warmup_steps, ws.lr_schedule)  # fail before any work
    policies = policies or demonstration_policies(config, trajectories)
    torch.manual_seed(ws.seed)
    out = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        source = starting_point(config, ws, base, Path(tmp), policies, log)
        model = load_pretrained(source)
        tokenizer = load_tokenizer(source)
        prepare_chat(tokenizer, config.model)  # demonstrations in the model's tool format
        if ws.recall_rows:
            from agentrl.curriculum.recall import recall_rows
        ordinary = tokenizer.raw.get_vocab_size(with_added_tokens=False)
        if ws.copy_steps or ws.copy_rows:
            from agentrl.train.copy_pretrain import copy_pretrain, generic_rows
        if ws.copy_steps:
            copy_pretrain(model, ordinary, ws.copy_steps, ws.copy_lr, ws.seed, log,
                          keyed_steps=ws.keyed_steps)
        rollouts = demonstrations_under(config, ws, tokenizer, policies, log)
        rows = to_rows(rollouts)
        log(f"{len(rollouts)} demonstrations, {len(rows)} rows, "
            f"{sum(r.num_generated_tokens for r in rows)} generated tokens")
        optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr)
        rng = random.Random(ws.seed)
        # the RL update's micro-batch budget (fewer, larger packs), or the longest row
        budget = max(config.batch.max_tokens_per_microbatch, *(len(r.token_ids) for r in rows))
        for step in range(ws.num_steps):
            for group in optimizer.param_groups:
                group["lr"] = sft_lr(step, ws.num_steps, ws.lr, ws.warmup_steps,
                                     ws.lr_schedule)
            batch = rng.sample(rows, min(ws.rows_per_step, len(rows)))
            if ws.recall_rows:
                batch += recall_rows(rng, tokenizer.encode, ws.recall_rows)
            if ws.copy_rows:
                batch += generic_rows(rng, ordinary, ws.copy_rows)
            loss = sft_step(model, batch, optimizer, budget)
            if step % 50 == 0 or step == ws.num_steps - 1:
                log(f"sft step {step}: loss {loss:.4f} per generated token, "
                    f"lr {optimizer.param_groups[0]['lr']:.2e}")
        save_pretrained(model, out)
        copy_tokenizer_files(source, out)
    return out
