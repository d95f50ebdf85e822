"""What the plan-time checks (:mod:`agentrl.train.preflight`) share: :class:`Preflight`
builds each piece once, on first use: each environment (id, keyword arguments, data files),
the model folder's ``config.json`` and the tokenizer; never the weights. Also the rules of
building a configured environment and of finding the model folder, which training uses too.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from agentrl.config import Config, ConfigError, EnvironmentConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ModelFacts:
    """What the checks need to know about the model, read from its config.json."""

    folder: Path | None
    """The model folder; None for the tiny built-in model (built at train time)."""
    model_type: str
    max_position_embeddings: int
    """Positions the model was trained for: the longest row (prompt + generated) it takes."""

    def describe(self) -> str:
        """Where the model comes from, as the plan prints it."""
        where = str(self.folder) if self.folder else "the tiny built-in model (model.path empty)"
        return f"{where}: {self.model_type}, {self.max_position_embeddings} positions"


@dataclass(frozen=True)
class RowBound:
    """The longest row a rollout can make, in tokens, and how that follows from the knobs."""

    tokens: int
    how: str
    """The arithmetic, e.g. "compaction.max_context_tokens + rollout.max_new_tokens = ..."."""
    knob: str
    """What to lower to shorten it."""
    engine_capped: bool = False
    """The bound is the engine's context plus the one token it never feeds back, and
    that context never passes the model's positions (the row's last position predicts
    nothing), so the positions check holds for it by construction."""


class Preflight:
    """The pieces the checks share, each built once on first use."""

    def __init__(self, config: Config) -> None:
        """Nothing is built yet."""
        self.config = config
        self._envs: dict[int, Any] = {}

    def environment(self, index: int) -> Any:
        """Environment ``index`` of the config, built once (its id, kwargs and data files
        checked on the way)."""
        if index not in self._envs:
            self._envs[index] = build_environment(self.config.environments[index], index)
        return self._envs[index]

    @cached_property
    def model(self) -> ModelFacts:
        """The model's facts from ``model.path``'s config.json (no weights read)."""
        if not self.config.model.path:
            from agentrl.model.tiny import TINY_MAX_POSITIONS

            return ModelFacts(None, "qwen2", TINY_MAX_POSITIONS)
        folder = locate_model_dir(self.config.model.path)
        check_model_folder(folder, self.config.model.path)
        from agentrl.model import read_args

        try:
            args = read_args(folder)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"model.path = {self.config.model.path!r}: {folder}/config.json "
                              f"cannot be read as a model ({_one_line(exc)})") from None
        return ModelFacts(folder, args.model_type, args.max_position_embeddings)

    @cached_property
    def tokenizer(self) -> Any:
        """The model folder's tokenizer, or the one the tiny built-in model will have (the
        same seed builds the same tokenizer)."""
        if self.model.folder is None:
            from agentrl.model.tiny import tiny_tokenizer

            return tiny_tokenizer(self.config.train.seed)
        from agentrl.model import load_tokenizer

        return load_tokenizer(self.model.folder)

    @property
    def tokenizer_name(self) -> str:
        """Where :attr:`tokenizer` comes from, for printed tables."""
        return str(self.model.folder) if self.model.folder else "the tiny built-in model's"

    def prompt_budget(self, index: int) -> Any:
        """Environment ``index``'s first prompt by part (``agentrl.envs.context_budget``)."""
        from agentrl.envs.context_budget import measure_first_prompt
        from agentrl.rollout.compact_tool import offered_tools
        from agentrl.rollout.failures import PersistentFailure, with_retries

        env = self.config.environments[index]
        extra = offered_tools(self.config.compaction.strategy, [])

        def measure() -> Any:  # a fresh instance after a failed reset, as in training
            # the environment and the model folder raise ConfigErrors of their own
            built, tokenizer = self.environment(index), self.tokenizer
            try:
                return measure_first_prompt(built, tokenizer, env.display_name(),
                                            extra_tools=extra)
            except Exception:
                self._envs.pop(index, None)
                raise

        attempts = 1 + self.config.rollout.max_retries
        try:  # a reset that fails now and then (a flaky server) is retried, as in training
            return with_retries(measure, attempts,
                                lambda exc: not isinstance(exc, ConfigError))[0]
        except PersistentFailure as exc:  # a user reset or tool_schemas can raise anything
            cause = exc.__cause__
            raise ConfigError(f"environments[{index}] ({env.id}): its first prompt cannot be "
                              f"built: {type(cause).__name__}: {_one_line(cause)} (it failed "
                              f"all {attempts} attempts, rollout.max_retries = "
                              f"{attempts - 1}); `agentrl check-env {env.id}` shows where") \
                from None

    def subagent_prompts(self, index: int) -> dict[str, int]:
        """Environment ``index``'s subagents: tokens of each one's prompt before its task
        (system and tool schemas; ``agentrl.envs.context_budget.subagent_prompt_tokens``)."""
        from agentrl.envs.context_budget import subagent_prompt_tokens
        from agentrl.rollout.compact_tool import offered_tools

        return subagent_prompt_tokens(self.environment(index), self.tokenizer,
                                      offered_tools(self.config.compaction.strategy, []))

    def first_prompt_tokens(self, index: int) -> int:
        """Tokens of environment ``index``'s longest first prompt (system, task and tool
        schemas through the chat template)."""
        return self.prompt_budget(index).total

    @cached_property
    def longest_row(self) -> RowBound:
        """The longest row any rollout can make under these settings: the built-in loop's
        (:meth:`loop_row`) or, with a harness environment, a program's request (its
        prompt is the program's own context, which compaction never cuts: only the
        engine's context bounds it)."""
        loop = self.loop_row
        harnesses = [env.display_name() for env in self.config.environments
                     if env.harness is not None]
        if not harnesses:
            return loop
        from agentrl.engines.build import engine_max_len, max_request_row

        positions = self.model.max_position_embeddings
        context, total = engine_max_len(self.config, positions), max_request_row(
            self.config, positions)
        harness = RowBound(
            total, f"a harness request of {', '.join(harnesses)} is a row of the program's "
            "own context, which compaction does not cut: the engine's context "
            f"{context} (a prompt of up to {context - 1} tokens, then generated tokens while "
            f"they fit) + its last sampled token, never fed back, = {total}",
            "compaction.max_context_tokens or rollout.max_new_tokens (they size the engine's "
            "context)" if self.config.compaction.strategy != "none" else
            "rollout.max_rollout_tokens (it sizes the engine's context)",
            engine_capped=context == positions)
        return loop if loop.tokens >= harness.tokens else harness

    @cached_property
    def loop_row(self) -> RowBound:
        """The longest row the built-in multi-turn loop can make (compaction, threads)."""
        rollout, compaction = self.config.rollout, self.config.compaction
        if compaction.strategy != "none":
            total = compaction.max_context_tokens + rollout.max_new_tokens
            how = ("compaction.max_context_tokens + rollout.max_new_tokens = "
                   f"{compaction.max_context_tokens} + {rollout.max_new_tokens}")
            if compaction.asks_for_summary:
                from agentrl.engines.build import SUMMARY_REQUEST_TOKENS

                total += SUMMARY_REQUEST_TOKENS + compaction.summary_max_tokens
                how += (f" + the summary request (<= {SUMMARY_REQUEST_TOKENS}) + "
                        f"compaction.summary_max_tokens {compaction.summary_max_tokens}")
            return RowBound(total, f"{how} = {total}",
                            "compaction.max_context_tokens (or rollout.max_new_tokens)")
        prompt, name = max((self.first_prompt_tokens(i), env.display_name())
                           for i, env in enumerate(self.config.environments))
        what = f"{prompt} for {name}'s first task"
        total = prompt + rollout.max_rollout_tokens
        main = RowBound(
            total, f'with compaction.strategy = "none" a thread is one row: prompt ({what}) '
            f"+ rollout.max_rollout_tokens {rollout.max_rollout_tokens} = {total}, before "
            "observations", 'rollout.max_rollout_tokens (or turn compaction on)')
        subagents = [(head, f"{env.display_name()}'s subagent {agent}")
                     for i, env in enumerate(self.config.environments)
                     for agent, head in self.subagent_prompts(i).items()]
        if not subagents:
            return main
        head, who = max(subagents)
        total = head + rollout.max_subagent_tokens
        thread = RowBound(
            total, f'with compaction.strategy = "none" a thread is one row: {who} starts '
            f"from {head} tokens + rollout.max_subagent_tokens {rollout.max_subagent_tokens} "
            f"= {total}, before its task text and observations",
            "rollout.max_subagent_tokens (or turn compaction on)")
        return max(main, thread, key=lambda bound: bound.tokens)

    def close(self) -> None:
        """Close the environments built so far."""
        for env in self._envs.values():
            close = getattr(env, "close", None)
            if close is not None:
                close()
        self._envs.clear()


# --------------------------------------------------------------------------- environments


def build_environment(env: EnvironmentConfig, index: int) -> Any:
    """Build one configured environment; a ConfigError names what is wrong and the fix."""
    from agentrl.envs.registry import make, resolve

    where = f"environments[{index}]"
    try:
        target = resolve(env.id)
    except ValueError as exc:
        raise ConfigError(f"{where}.id: {_one_line(exc)}") from None
    accepted = accepted_keywords(_environment_class(target))
    unknown = [key for key in env.kwargs if accepted is not None and key not in accepted]
    if unknown and accepted is not None:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ";"
        raise ConfigError(
            f"{where}.kwargs: {env.id} takes no keyword '{unknown[0]}'{hint} it accepts: "
            f"{', '.join(accepted)}")
    try:
        return make(env.id, **env.kwargs)
    except Exception as exc:  # a user constructor can raise anything; report it, one line
        raise ConfigError(f"{where} ({env.id}) cannot be built: {type(exc).__name__}: "
                          f"{_one_line(exc)}") from None


def _environment_class(target: Any) -> type:
    if not isinstance(target, str):
        return target
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry_point = gymnasium.registry[target].entry_point
    return load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point


def accepted_keywords(cls: Any) -> list[str] | None:
    """Keyword arguments a constructor accepts, following ``**kwargs`` up the classes it
    passes them to; None when that cannot be known (a ``**kwargs`` that goes nowhere)."""
    names: list[str] = []
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return None
        params = list(inspect.signature(init).parameters.values())[1:]  # drop self
        names += [p.name for p in params
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


# --------------------------------------------------------------------------- model folder


def locate_model_dir(path: str) -> Path:
    """The folder ``model.path`` names: as given (relative to the working directory), else
    relative to the project; it must hold a config.json."""
    given = Path(path)
    candidates = list(dict.fromkeys((given.resolve(), (PROJECT_ROOT / given).resolve())))
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return given if candidate == given.resolve() else candidate
    raise ConfigError(
        f"model.path = {path!r} has no config.json (looked in "
        f"{' and '.join(map(str, candidates))}); give a local Hugging Face folder, or leave "
        "model.path empty for the tiny built-in model")


def check_model_folder(folder: Path, path: str) -> None:
    """A model folder holds safetensors weights and a tokenizer next to its config.json."""
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.safetensors.index.json")):
        raise ConfigError(
            f"model.path = {path!r}: {folder} has a config.json but no *.safetensors weights; "
            "point model.path at a complete Hugging Face folder")
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(
            f"model.path = {path!r}: {folder} has no tokenizer.json; copy the tokenizer "
            "files of the base model into it")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
