"""Plan-time checks that each configured part can be built or loaded
(:mod:`agentrl.train.preflight`): environments, agent programs, the model and its chat
template, the trackers' packages, LoRA's target modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.train.preflight_facts import Preflight, _one_line


def check_environments(pf: Preflight) -> str:
    """Every environment builds: known id, accepted keywords, data files present."""
    errors, names = [], []
    for index, env in enumerate(pf.config.environments):
        try:
            pf.environment(index)
            names.append(env.display_name())
        except ConfigError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return f"environments: {', '.join(names)} built"


def check_model(pf: Preflight) -> str:
    """``model.path`` is a model folder whose config.json we can run."""
    return f"model: {pf.model.describe()}"


def check_trackers(pf: Preflight) -> str:
    """``log.wandb`` and ``log.mlflow``: their packages are installed."""
    from agentrl.config.extras import EXTRAS

    log = pf.config.log
    wanted = [(name, setting) for name, setting in (("wandb", log.wandb),
                                                    ("mlflow", log.mlflow)) if setting]
    missing = [name for name, _ in wanted if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError("\n".join(
            f"log.{name} needs the {name} package, which is not installed: pip install "
            f"'agentrl[{EXTRAS[name]}]' (or remove log.{name})" for name in missing))
    return f"trackers: {', '.join(name for name, _ in wanted) or 'none'} (besides metrics.jsonl)"


def check_lora(pf: Preflight) -> str:
    """``[model.lora]``: its target_modules select projections of this model (the same
    rule training applies), and how much of the model trains."""
    lora = pf.config.model.lora
    if lora is None:
        return "weights: every weight trains (no [model.lora])"
    import torch

    from agentrl.model import CausalLM, ModelArgs, read_args
    from agentrl.model.lora import count_adapter_parameters, target_names

    folder = pf.model.folder
    args = read_args(folder) if folder else ModelArgs(  # the tiny built-in model's shape
        vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
        tie_word_embeddings=True)
    with torch.device("meta"):
        model = CausalLM(args, attention="torch")
    try:
        names = target_names(model, lora)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    total = sum(p.numel() for p in model.parameters())
    adapters = count_adapter_parameters(args, lora)
    return (f"LoRA: rank {lora.rank} on {len(names)} projections, {adapters:,} adapter "
            f"parameters ({100 * adapters / total:.2f}% of the model); the base is frozen")


def check_harnesses(pf: Preflight) -> str:
    """Every agent program can start: its callable (and grader) imports, or its command's
    program exists (docs/harnesses.md)."""
    import shutil

    from agentrl.envs.harness import own_python
    from agentrl.envs.registry import load_object
    from agentrl.sandbox.program import unreadable_program

    lines, errors = [], []
    for env in pf.config.environments:
        harness, name = env.harness, env.display_name()
        if harness is None:
            continue
        try:
            for what, target in (("harness.run", harness.run),
                                 ("harness.grader", harness.grader)):
                if target and not callable(load_object(target, what)):
                    raise ValueError(f"{what} = {target!r} is not callable")
        except Exception as exc:  # noqa: BLE001 - a user file may raise anything
            errors.append(f"environment {name!r}: harness: {_one_line(exc)}")
            continue
        program = own_python(harness.command)[0] if harness.command else ""
        if program and shutil.which(program, path=None) is None and not Path(
                harness.cwd or ".", program).is_file():
            errors.append(f"environment {name!r}: harness.command: no program {program!r} "
                          "(not on PATH, not a file); give its path")
            continue
        if program and harness.sandbox and (why := unreadable_program(program,
                                                                      harness.cwd or ".")):
            errors.append(f"environment {name!r}: harness.command: {why}")
            continue
        runs = harness.run or " ".join(harness.command)
        lines.append(f"{name} runs {runs}" + (" in the sandbox" if harness.sandbox else ""))
    if errors:
        raise ConfigError("\n".join(errors))
    return "harnesses: " + ("; ".join(lines) if lines else "none")


def check_chat_template(pf: Preflight) -> str:
    """The model's tool-call format and what its chat template does to multi-turn rows
    (a scripted tool conversation through the template; docs/models.md)."""
    from agentrl.rollout.template_check import prepare_chat

    finding = prepare_chat(pf.tokenizer, pf.config.model)
    return finding.describe().replace("\n", "; ")
