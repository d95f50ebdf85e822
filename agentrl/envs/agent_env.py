"""``AgentEnv``: a Gymnasium environment whose observations are chat messages and whose
actions are the model's text.

The contract the rollout runner relies on
-----------------------------------------
- ``reset(*, seed=None, options=None) -> (messages, info)``: the task, as a list of
  :class:`agentrl.types.Message` (system + user). The same seed gives the same task, so
  every rollout of a group starts identically. ``options={"split": "eval"}`` draws from
  the held-out tasks instead ("train" is the default); the two splits never share a task.
  Validation calls ``reset(seed=i, options={"split": "eval"})`` for ``i in range(n)``.
- ``step(action: str) -> (messages, reward, terminated, truncated, info)``. When the text
  holds tool calls, they run and the observation is one ``role="tool"`` message (with
  ``name``) per call; otherwise the text is the final answer: it is graded and the
  episode terminates. ``truncated`` is True when ``max_turns`` steps passed without an
  answer.
- **The rollout's reward is the sum of its step rewards** (built-ins give 0.0 on every
  step but the last), times the config's ``reward_scale``. To reward intermediate steps,
  override ``step`` and add to the reward it returns (docs/writing-environments.md).
- Turn limits: the rollout ends at whichever comes first, this environment's
  ``max_turns`` (``step`` returns ``truncated=True``) or the config's ``rollout.max_turns``.
- ``info["tool_errors"]``: dict kind -> count of failed tool calls in this step (kinds in
  :data:`agentrl.envs.tools.ERROR_KINDS`); empty when none failed. Summed over the rollout
  by the runner into ``RolloutStats.tool_errors``.
- ``info["reward_components"]``: dict name -> float, named parts of the reward for
  logging only (they need not sum to the reward); empty until the final step.
- ``info["num_tool_calls"]``: calls attempted in this step.
- Blocking: ``step`` may block (tools, subprocesses). The runner calls ``reset``,
  ``tool_schemas``, ``step`` and ``close`` each under the deadline
  ``rollout.step_timeout_s`` and the constructor under ``rollout.rollout_timeout_s``
  (see :mod:`agentrl.rollout.env_guard`), each call on its own thread
  (``isolation = "thread"``, the default; an environment with native async I/O overrides
  ``astep``, which is then awaited instead), on the event loop itself
  (``isolation = "inline"``, for quick calls) or in a worker process
  (``isolation = "process"``). A call that timed out may still be running, so the runner
  drops that instance (the rollout is invalid) and closes it once the call returns.
- Checked on every call (:mod:`agentrl.rollout.env_contract`): ``reset`` returns a
  2-tuple with a non-empty message list; ``step`` a 5-tuple whose reward is a finite real
  number (inside ``reward_range`` when declared), ``terminated``/``truncated`` bools;
  observations are lists of ``Message`` with ``str`` content that encodes as UTF-8, at
  most ``rollout.max_observation_chars`` characters per call; ``info`` is a dict. A
  violation invalidates that rollout with a message naming the environment, the method
  and the expected type; it never stops the run (unless most rollouts of an environment
  fail: ``train.max_invalid_fraction``).
- Subagents (``@subagent`` methods, :mod:`agentrl.envs.subagents`): a step that calls one
  returns ``([], 0.0, False, False, info)`` with ``info["subagent_calls"]`` and waits;
  the runner plays each call's thread with ``thread_step(thread_id, action)`` (reward
  0.0; a reply without tool calls is the answer, ``info["answer"]``) and finishes the
  step with ``complete_step(thread_id, results)``. The same checks apply to both, and the
  runner calls them one at a time per instance.
- An env instance is stateful: one instance per concurrent rollout.
- ``tool_schemas()``: OpenAI-style function schemas of the ``@tool`` methods, for the
  chat template's ``tools`` argument.

Writing an environment: subclass, implement ``sample_task(rng) -> Task`` and
``grade(answer) -> Grade | float``, optionally add ``@tool`` methods and a scripted policy
``demonstrate(messages) -> str | None`` (for ``agentrl sft`` and ``agentrl check-env``).
A subclass ``__init__`` must call ``super().__init__(**kwargs)``. See
``docs/writing-environments.md`` and ``examples/custom_env/`` (one in under 60 lines).

``Task``, ``Grade`` and the train/eval split of a task key are :mod:`agentrl.envs.task`;
the tool-turn machinery (tool calls, subagent threads, turn limits) is
:mod:`agentrl.envs.turns`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium
import msgspec
import numpy as np

from agentrl.envs.parsers import make_parser
from agentrl.envs.spaces import MessageSpace, TextSpace
from agentrl.envs.subagents import (
    SubagentResult,
    ThreadBook,
    collect_subagents,
)
from agentrl.envs.task import SPLITS, Grade, Task, split_of_key
from agentrl.envs.tools import (
    MAX_OUTPUT_CHARS,
    ToolCallParser,
    collect_tools,
)
from agentrl.envs.turns import ToolTurns
from agentrl.types import MAIN_THREAD, Message


class AgentEnv(gymnasium.Env[list[Message], str], ToolTurns):
    """Base of every agentrl environment; see the module docstring for the contract."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}  # fps: silences check_env
    max_turns: int = 8
    """Steps before the episode is truncated."""
    tool_timeout_s: float = 10.0
    """Seconds one tool call may take (a ``@tool(timeout_s=...)`` overrides it)."""
    max_tool_calls_per_turn: int = 8
    max_tool_output_chars: int = MAX_OUTPUT_CHARS
    """Characters of one tool message; longer output is cut with a marker the model sees."""
    eval_fraction: float = 0.1
    """Share of task keys held out for the eval split."""
    isolation: str = "thread"
    """Where the runner keeps each instance: "thread" (in the trainer's process; each call
    on its own thread, cut off at ``rollout.step_timeout_s``), "inline" (in the trainer's
    process, each call on the event loop itself: no thread hand-off, for environments
    whose every call is quick pure Python that always returns; a call past its deadline
    is only reported when it returns) or "process" (a worker process killed at the
    deadline, whatever the code does). Choose "process" when a step can hold the GIL for
    long (C extensions, big regexes on model text): in-process, such a step freezes
    every other rollout until it returns."""
    reward_range: tuple[float, float] | None = None
    """Declared bounds of one step's reward; a step reward outside them invalidates the
    rollout (``bad_reward``). None: any finite float."""
    main_tools: tuple[str, ...] | None = None
    """Names of the ``@tool`` and ``@subagent`` methods offered to the main thread; None:
    all of them. (A subagent's own tools are the ``tools=`` of its ``@subagent``.)"""

    def __init__(self, *, max_turns: int | None = None, render_mode: str | None = None,
                 parser: str | ToolCallParser | None = None):
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode {render_mode!r} is not supported; use None or 'ansi'")
        if max_turns is not None:
            if max_turns < 1:
                raise ValueError(f"max_turns is {max_turns}; it must be >= 1")
            self.max_turns = max_turns
        self.render_mode = render_mode
        self.parser = _make_parser(parser or "hermes")
        self.parser_from_model = parser is None
        """No parser was named: the run gives this environment the model's tool-call
        format (``model.tool_format``; see ``agentrl.envs.parsers``)."""
        self.observation_space = MessageSpace()
        self.action_space = TextSpace()
        self.tools = collect_tools(self)
        self.subagents = collect_subagents(self, self.tools)
        self.task: Task | None = None
        self.history: list[Message] = []
        self.threads = ThreadBook()
        self.calling_thread = MAIN_THREAD
        """The thread whose turn is running its tools (``MAIN_THREAD`` or a subagent's
        id): a tool that keeps per-thread state reads it (see ``thread_arguments``)."""
        self._turn = 0
        self._done = True

    # ------------------------------------------------------------------ subclass hooks

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Draw one task from the generator; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement sample_task(rng)")

    def grade(self, answer: str) -> Grade | float:
        """Score a final answer against ``self.task``; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement grade(answer)")

    def demonstrate(self, messages: list[Message]) -> str | None:
        """Optional scripted policy: the next assistant message of a correct episode.

        ``messages`` is the conversation so far as this environment saw it (the reset
        messages, then every assistant message and the tool messages after it; never
        compacted), and ``self.task`` is the current task. For a subagent thread it is
        that thread's conversation, which starts with the subagent's system prompt.
        Return the text the model should write next: tool calls
        (:func:`agentrl.envs.tools.format_call` writes them) or the final answer.
        ``agentrl sft`` plays it through the rollout runner to warm-start a model;
        ``agentrl check-env`` plays it as its scripted episodes. Act on what the model can
        see after compaction (the task and the newest turn), so the policy is learnable.
        The default returns None: no scripted policy.
        """
        return None

    def format_call(self, name: str, /, **arguments: Any) -> str:
        """One tool call in the model's own format (this environment's parser), for
        ``demonstrate``: ``self.format_call("grep", pattern="ERROR")``."""
        return self.parser.format_call(name, arguments)

    def demonstrate_summary(self, messages: list[Message], forced: bool) -> str | None:
        """Optional, beside ``demonstrate``: the summary a correct policy writes now, so
        ``agentrl sft`` can warm-start compaction by summary (``messages`` as for
        ``demonstrate``: never compacted).

        ``forced=True``: the context is full and a summary is asked for (strategy
        ``summarize``, or the ``tool`` strategy's summarize fallback); return the summary.
        ``forced=False`` (strategy ``tool``, before each action): return the summary to
        call the ``compact`` tool with now, or None to act without compacting. Keep in it
        what the rest of the task needs (see ``needed_facts``). The default returns None:
        no summaries (a summarize warm start then refuses with this method's name).
        """
        return None

    def needed_facts(self) -> list[str]:
        """Optional: what the current task's answer needs from the conversation, as
        strings that appear verbatim in the observations (e.g. the entries a final
        question asks for). For every compaction the run then records which of the facts
        revealed so far the compacted context still holds (``compaction/fact_survival``
        per environment; ``agentrl inspect`` shows what each summary kept and lost). The
        default, []: nothing is measured."""
        return []

    def draw_task(self, rng: np.random.Generator, split: str) -> Task:
        """A task of the given split: resample until the task's key hashes into it."""
        for _ in range(10_000):
            task = self.sample_task(rng)
            if split_of_key(task.key or repr(task.messages), self.eval_fraction) == split:
                return task
        raise ValueError(
            f"{type(self).__name__}: no {split!r} task found in 10000 draws; the task space "
            "is too small for eval_fraction — widen the difficulty settings"
        )

    # ------------------------------------------------------------------ gymnasium API

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas of the main thread's tools and subagents (maybe
        empty)."""
        return [bound.spec.schema() for bound in self._toolset(MAIN_THREAD).values()]

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start a new task; the same seed (and split) gives the same task."""
        super().reset(seed=seed)
        split = (options or {}).get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"options['split'] is {split!r}; use one of {SPLITS}")
        self.task = self.draw_task(self.np_random, split)
        self.history = [msgspec.structs.replace(m) for m in self.task.messages]
        self.threads = ThreadBook()
        self._turn = 0
        self._done = False
        return [msgspec.structs.replace(m) for m in self.history], {"split": split}

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the tool calls in the text, or grade it as the final answer."""
        self.begin_step(action, started=self.task is not None)
        calls = self.parser.parse(action)
        info: dict[str, Any] = {"tool_errors": {}, "reward_components": {},
                                "num_tool_calls": len(calls)}
        if not calls:
            grade = self.grade(action)
            grade = grade if isinstance(grade, Grade) else Grade(float(grade))
            info["reward_components"] = dict(grade.components)
            self._done = True
            return [], float(grade.reward), True, False, info
        return self._tool_turn(MAIN_THREAD, calls, info)

    def thread_step(self, thread_id: str, action: str) -> tuple[list[Message], float, bool,
                                                                 bool, dict[str, Any]]:
        """One turn of a subagent thread (see :mod:`agentrl.envs.subagents`): its tool
        calls run; a reply without calls is the thread's answer (``info["answer"]``) and
        ends it. The reward is always 0.0."""
        state = self.threads.state(thread_id)
        if thread_id in self.threads.pending:
            raise ValueError(f"thread_step({thread_id!r}) called while its last step waits "
                             "for its subagents; call complete_step first")
        calls = self._read_turn(state.history, action)
        state.turn += 1
        info: dict[str, Any] = {"tool_errors": {}, "num_tool_calls": len(calls)}
        if not calls:
            state.done = True
            info["answer"] = action.strip()
            return [], 0.0, True, False, info
        return self._tool_turn(thread_id, calls, info)

    def complete_step(self, thread_id: str, results: list[SubagentResult]) -> tuple[
            list[Message], float, bool, bool, dict[str, Any]]:
        """Finish a step that waited for subagents: their answers (or errors) take their
        calls' places in the observation, as tool messages."""
        observation, info = self.threads.take_pending(thread_id, results,
                                                      self.max_tool_output_chars)
        return self._end_turn(thread_id, observation, info)

    def thread_arguments(self) -> dict[str, Any]:
        """The arguments of the subagent call that started the thread whose tools are
        running (``{}`` in the main thread): e.g. the document a reader was given."""
        state = self.threads.threads.get(self.calling_thread)
        return dict(state.arguments) if state is not None else {}

    def thread_history(self, thread_id: str = MAIN_THREAD) -> list[Message]:
        """A thread's conversation so far (the main one: ``history``)."""
        if thread_id == MAIN_THREAD:
            return self.history
        state = self.threads.threads.get(thread_id)
        if state is None:
            raise ValueError(f"no subagent thread {thread_id!r} in this episode")
        return state.history

    def begin_step(self, action: Any, started: bool) -> None:
        """Refuse a step outside an episode or a non-text action; count the turn and
        record the action (the start of every ``step``, also of an override)."""
        if self._done or not started:
            raise ValueError("step() called on a finished or unstarted episode; call reset()")
        if MAIN_THREAD in self.threads.pending:
            raise ValueError("step() called while the last step waits for its subagents; "
                             "call complete_step('main', results) first")
        if not isinstance(action, str):
            raise ValueError(f"action must be the model's text (str), got {type(action)}")
        self._turn += 1
        self.history.append(Message("assistant", action))

    async def astep(self, action: str) -> tuple[list[Message], float, bool, bool, dict]:
        """``step`` in a worker thread. The runner calls ``step`` on its own thread instead
        unless a subclass overrides this (native async I/O), which it then awaits under
        the same deadline."""
        return await asyncio.to_thread(self.step, action)

    def render(self) -> str | None:
        """The transcript so far as text ("ansi" mode)."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m.role}{':' + m.name if m.name else ''}] {m.content}"
                         for m in self.history)

    # ------------------------------------------------------------------ internals

    def __getattr__(self, name: str) -> Any:
        # Reached only when normal lookup failed: an attribute AgentEnv.__init__ sets is
        # missing, so a subclass __init__ skipped it. Say so instead of letting Gymnasium
        # report "must specify an action space" (a TypeError, so hasattr does not hide it).
        if name in _SET_BY_INIT:
            raise TypeError(missing_init_message(type(self)))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_SET_BY_INIT = frozenset({"observation_space", "action_space", "tools", "subagents",
                          "parser", "task", "history", "threads", "calling_thread", "_turn",
                          "_done"})


def missing_init_message(cls: type) -> str:
    """The error for a subclass whose ``__init__`` never ran ``AgentEnv.__init__``."""
    name = cls.__name__
    return (f"{name}.__init__ did not call super().__init__(**kwargs), so the environment "
            f"has no action space, tools or tool-call parser; add `super().__init__(**kwargs)` "
            f"as the first line of {name}.__init__ (and accept **kwargs there, so max_turns "
            "and parser reach AgentEnv)")


def has_demonstration(env: Any) -> bool:
    """Whether the environment's class overrides :meth:`AgentEnv.demonstrate`."""
    method = getattr(type(env), "demonstrate", None)
    return method is not None and method is not AgentEnv.demonstrate


def _make_parser(parser: str | ToolCallParser) -> ToolCallParser:
    return make_parser(parser) if isinstance(parser, str) else parser
