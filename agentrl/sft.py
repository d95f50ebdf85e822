"""Warm start: supervised training on demonstrations played through the real rollout code.

A tiny model from random weights never produces a well-formed tool call, so RL has no
signal. The fix is a short supervised phase on correct demonstrations. The
demonstrations are *played*, not rendered: a scripted engine (:class:`DemoEngine`) stands
in for the model inside the ordinary rollout runner, so every demonstration row has
exactly the token layout RL will see (chat template, tool-response deltas, compaction),
and its ``loss_mask`` marks what the policy must learn to generate.

The scripted policies read the prompt text the engine receives: :func:`demonstration`
knows the built-in Calculator and Countdown tasks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import tempfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import torch

from agentrl.config import Config
from agentrl.packing import collate, pack
from agentrl.reassembler import to_rows
from agentrl.rollout.engine import Generation, SamplingParams
from agentrl.types import Rollout, Row

# --------------------------------------------------------------------------- demonstrations

_OPERATIONS = (
    (re.compile(r"get (\d+) more"), "+"),
    (re.compile(r"find (\d+) more"), "+"),
    (re.compile(r"give away (\d+)"), "-"),
    (re.compile(r"multiplied by (\d+)"), "*"),
    (re.compile(r"group of (\d+)"), "/"),
)


def calculator_expression(problem: str) -> str:
    """The expression a Calculator word problem asks for, e.g. ``"(16 / 2) + 3"``."""
    sentences = [s.strip() for s in problem.split(".") if s.strip()]
    start = re.search(r"has (\d+)", sentences[0])
    if start is None:
        raise ValueError(f"not a Calculator problem: {problem!r}")
    expression = start.group(1)
    for sentence in sentences[1:]:
        for pattern, op in _OPERATIONS:
            found = pattern.search(sentence)
            if found:
                if " " in expression:  # earlier steps happen first: bracket them
                    expression = f"({expression})"
                expression = f"{expression} {op} {found.group(1)}"
                break
    return expression


def countdown_solution(numbers: list[int], target: int) -> str | None:
    """An expression using every number once that equals ``target`` (brute force, small)."""
    ops = ("+", "-", "*", "/")
    for order in itertools.permutations(numbers):
        for chosen in itertools.product(ops, repeat=len(order) - 1):
            value, text = Fraction(order[0]), str(order[0])
            for number, op in zip(order[1:], chosen, strict=True):
                if op == "/" and number == 0:
                    break
                value = {"+": value + number, "-": value - number, "*": value * number,
                         "/": value / number if number else value}[op]
                text = f"({text}) {op} {number}" if op in "*/" and " " in text else \
                    f"{text} {op} {number}"
            else:
                if value == target:
                    return text
    return None


def demonstration(prompt_text: str) -> str:
    """The next assistant message of a correct episode, read from the rendered prompt.

    Calculator: first a ``calculate`` tool call, then the number the tool returned.
    Countdown: ``<answer>expression</answer>``.
    """
    responses = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", prompt_text, re.S)
    if "calculate" in prompt_text and responses:
        return responses[-1].strip()
    users = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt_text, re.S)
    if not users:
        raise ValueError("demonstration(): the prompt holds no user message")
    task = users[-1]
    if "calculate" in prompt_text:
        call = {"name": "calculate", "arguments": {"expression": calculator_expression(task)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    numbers = re.search(r"Numbers: ([\d, ]+)", task)
    target = re.search(r"Target: (\d+)", task)
    if numbers and target:
        solution = countdown_solution([int(n) for n in numbers.group(1).split(",")],
                                      int(target.group(1)))
        return f"<answer>{solution}</answer>"
    raise ValueError(f"demonstration(): no scripted policy for the task {task[:80]!r}")


class DemoEngine:
    """An ``InferenceEngine`` that answers with a scripted policy's text (log-probs 0)."""

    def __init__(self, tokenizer: Any, policy: Callable[[str], str] = demonstration) -> None:
        """``policy``: prompt text → the assistant's next message (without end token)."""
        self.tokenizer = tokenizer
        self.policy = policy

    weight_version = 0
    """A script has one version."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """Decode the prompt, ask the policy, encode its reply plus the end-of-turn token."""
        text = self.policy(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer.encode(text)[: params.max_tokens - 1]
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [0.0] * len(ids), "stop")

    def update_weights(self, named_tensors: Any, version: int | None = None) -> None:
        """Nothing to update: the policy is a script."""


# --------------------------------------------------------------------------- training


def sft_step(model: torch.nn.Module, rows: list[Row], optimizer: torch.optim.Optimizer,
             max_tokens: int) -> float:
    """One optimizer step of token-level cross-entropy on the rows' generated tokens.

    Normalized like the RL loss: each generated token weighs 1 / (generated tokens in the
    step), whatever the packing. Returns the mean loss per token.
    """
    ones = [1.0] * len(rows)
    batches = [collate(rows, ones, mb) for mb in pack([len(r.token_ids) for r in rows],
                                                      max_tokens)]
    num_tokens = max(sum(mb.num_tokens for mb in batches), 1)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for mb in batches:
        logprobs = model(mb.input_ids, mb.position_ids, mb.cu_seqlens,
                         targets=mb.target_ids).logprobs
        loss = -(logprobs * mb.loss_mask).sum() / num_tokens
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


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

    num_steps: int = 600
    """Optimizer steps of supervised training."""
    rows_per_step: int = 32
    num_demonstrations: int = 2000
    """Demonstration rollouts played (each environment by its weight)."""
    lr: float = 3e-3
    """Peak learning rate."""
    lr_schedule: str = "constant"
    """After warm-up: "cosine" or "linear" decay to 0 at the last step, or "constant"
    (the default: it made the shipped assets/quickstart-sft, which a 250-step cosine run at
    peak 3e-3 or 6e-3 did not match)."""
    warmup_steps: int = 0
    hidden_size: int = 128
    """Tiny model width, when no model.path is given."""
    num_layers: int = 2
    vocab_size: int = 1024
    seed: int = 0


async def play_demonstrations(config: Config, tokenizer: Any, num_rollouts: int,
                              seed: int) -> list[Rollout]:
    """Correct rollouts of the scripted policy, with the runner's exact token layout."""
    from agentrl.rollout.runner import RolloutRunner
    from agentrl.sampler import EnvironmentSampler

    single = msgspec.structs.replace(
        config,
        batch=msgspec.structs.replace(config.batch, n_samples_per_prompt=1),
        environments=[msgspec.structs.replace(e, group_size=1) for e in config.environments],
    )
    weights = {e.display_name(): e.weight for e in config.environments}
    runner = RolloutRunner(single, DemoEngine(tokenizer), tokenizer,
                           EnvironmentSampler(weights, seed))
    result = await runner.collect(0, num_rollouts)
    return [r for r in result.rollouts if r.valid and r.reward > 0]


def tokenizer_corpus(config: Config, num_rollouts: int = 300) -> list[str]:
    """Text of demonstration episodes, so the tiny tokenizer has merges for the task text
    (prompts of a few hundred tokens instead of over a thousand)."""
    from agentrl.model import build_tiny_checkpoint, load_tokenizer
    from agentrl.model.tiny import default_corpus

    # the bootstrap tokenizer makes long prompts: no compaction, so no episode is cut short
    config = msgspec.structs.replace(
        config, compaction=msgspec.structs.replace(config.compaction, strategy="none"),
        rollout=msgspec.structs.replace(config.rollout, max_rollout_tokens=4096))
    with tempfile.TemporaryDirectory() as tmp:
        bootstrap = load_tokenizer(build_tiny_checkpoint(Path(tmp) / "bootstrap"))
        rollouts = asyncio.run(play_demonstrations(config, bootstrap, num_rollouts, seed=12345))
        texts = [bootstrap.decode(s.token_ids) for r in rollouts for s in r.segments]
    return list(default_corpus(0)) + texts * 3


def warm_start(config: Config, out: str | Path, ws: WarmStartConfig, base: str | None = None,
               log: Callable[[str], None] = print) -> Path:
    """Load ``base`` (or build a new tiny model), train it on demonstrations of the config's
    environments, save an HF folder to ``out``."""
    from agentrl.checkpoint import copy_tokenizer_files
    from agentrl.model import (
        build_tiny_checkpoint,
        load_pretrained,
        load_tokenizer,
        save_pretrained,
    )

    sft_lr(0, ws.num_steps, ws.lr, ws.warmup_steps, ws.lr_schedule)  # fail before any work
    torch.manual_seed(ws.seed)
    out = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(base) if base else build_tiny_checkpoint(
            Path(tmp) / "base", hidden_size=ws.hidden_size, num_layers=ws.num_layers,
            num_heads=max(1, ws.hidden_size // 32), num_kv_heads=max(1, ws.hidden_size // 64),
            vocab_size=ws.vocab_size, corpus=tokenizer_corpus(config), seed=ws.seed)
        model = load_pretrained(source)
        tokenizer = load_tokenizer(source)
        rollouts = asyncio.run(play_demonstrations(config, tokenizer, ws.num_demonstrations,
                                                   ws.seed))
        rows = to_rows(rollouts)
        log(f"{len(rollouts)} demonstrations, {len(rows)} rows, "
            f"{sum(r.num_generated_tokens for r in rows)} generated tokens")
        optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr)
        rng = random.Random(ws.seed)
        budget = max(len(r.token_ids) for r in rows) * 4
        for step in range(ws.num_steps):
            for group in optimizer.param_groups:
                group["lr"] = sft_lr(step, ws.num_steps, ws.lr, ws.warmup_steps,
                                     ws.lr_schedule)
            loss = sft_step(model, rng.sample(rows, min(ws.rows_per_step, len(rows))),
                            optimizer, budget)
            if step % 50 == 0 or step == ws.num_steps - 1:
                log(f"sft step {step}: loss {loss:.4f} per generated token, "
                    f"lr {optimizer.param_groups[0]['lr']:.2e}")
        save_pretrained(model, out)
        copy_tokenizer_files(source, out)
    return out
