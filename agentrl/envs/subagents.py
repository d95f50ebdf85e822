"""Subagents: ``@subagent`` tools that hand a sub-task to a conversation of its own.

An environment method decorated with ``@subagent`` is offered to the model like a
``@tool`` (its schema comes from the type hints and docstring the same way). Calling it
does not run a function's result back to the model: the method's return value is the
*task text* of a new thread, a fresh conversation that starts from the subagent's system
prompt and that task, with its own tool set (the names in ``tools=``, which may include
other subagents) and its own context window. The same policy plays that thread; its
final answer (a reply without tool calls) comes back to the caller as the call's tool
message. The rollout runner (:mod:`agentrl.rollout.subagents`) plays the threads; this
module is the environment's side of the protocol:

1. ``step(action)`` (or ``thread_step``) whose calls include subagent calls runs the
   ordinary calls, then returns ``([], 0.0, False, False, info)`` with
   ``info["subagent_calls"]``: one :class:`SubagentCall` per subagent call, in order;
2. the runner plays each call's thread: ``thread_step(thread_id, action)`` for every
   turn, until a reply without tool calls (``terminated``; ``info["answer"]`` is what
   goes back) or a limit;
3. ``complete_step(thread_id, results)`` (one :class:`SubagentResult` per call, in
   order) finishes the parent's step: the observation holds every call's tool message in
   call order, the answers (or error texts) in place of the subagent calls.

Thread ids are given by the environment, from the parent's id and a count: the main
thread's subagents are ``"1"``, ``"2"``, ..., the children of ``"2"`` are ``"2.1"``, ...
so they do not depend on timing. A subagent thread earns no reward (its steps return
0.0): the rollout's one reward comes from the main thread.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import msgspec

from agentrl.envs.tools import BoundTool, ToolSpec, build_spec, marked_methods
from agentrl.text import clip, short_repr, valid_utf8
from agentrl.types import MAIN_THREAD, Message

_SUBAGENT_ATTR = "__agentrl_subagent__"


class SubagentSpec(msgspec.Struct, frozen=True):
    """What ``@subagent`` records: the call's schema and how the thread is set up."""

    tool: ToolSpec
    """The call as the caller's model sees it (name, description, parameters)."""
    system: str
    """The subagent thread's system prompt."""
    tools: tuple[str, ...] = ()
    """Names of the ``@tool`` (and ``@subagent``) methods the subagent may call."""
    max_turns: int | None = None
    """Model turns of one subagent thread; None: the environment's ``max_turns``."""
    max_tokens: int | None = None
    """Generated tokens of one subagent thread; None: ``rollout.max_subagent_tokens``
    (the smaller of the two applies)."""


def subagent(fn: Callable | None = None, *, system: str, tools: tuple[str, ...] | list[str]
             = (), name: str | None = None, max_turns: int | None = None,
             max_tokens: int | None = None, timeout_s: float | None = None) -> Any:
    """Mark a method as a subagent: the model calls it like a tool, the method builds the
    subagent's task text from the call's arguments, and a new thread (``system`` prompt,
    that task, the ``tools`` named) answers it. ``timeout_s`` bounds the method itself."""
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"@subagent: max_turns is {max_turns}; it must be >= 1")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"@subagent: max_tokens is {max_tokens}; it must be >= 1")

    def mark(func: Callable) -> Callable:
        hints = typing.get_type_hints(func)
        if hints.get("return", str) is not str:
            raise ValueError(f"@subagent {func.__name__}: it returns the subagent's task "
                             "text, so its return annotation must be str")
        spec = SubagentSpec(build_spec(func, name=name, timeout_s=timeout_s), system,
                            tuple(tools), max_turns, max_tokens)
        setattr(func, _SUBAGENT_ATTR, spec)
        return func

    return mark(fn) if fn is not None else mark


class BoundSubagent(msgspec.Struct, frozen=True):
    """A subagent spec together with the bound method that builds its task text."""

    spec: SubagentSpec
    fn: Callable[..., Any]

    @property
    def as_tool(self) -> BoundTool:
        """The task-text builder as a tool (validated and run like any tool call)."""
        return BoundTool(self.spec.tool, self.fn)


def collect_subagents(obj: Any, tools: dict[str, BoundTool]) -> dict[str, BoundSubagent]:
    """Every ``@subagent`` method of an object, by name; each one's ``tools`` must name
    ``@tool`` or ``@subagent`` methods of the same object."""
    found = {spec.tool.name: BoundSubagent(spec, getattr(obj, attr))
             for attr, spec in marked_methods(type(obj), _SUBAGENT_ATTR, SubagentSpec)}
    for bound in found.values():
        unknown = [t for t in bound.spec.tools if t not in tools and t not in found]
        if unknown:
            raise ValueError(
                f"{type(obj).__name__}: @subagent {bound.spec.tool.name} names tools "
                f"{unknown} that are neither @tool nor @subagent methods; it can use "
                f"{sorted([*tools, *found])}")
        clash = bound.spec.tool.name in tools
        if clash:
            raise ValueError(f"{type(obj).__name__}: {bound.spec.tool.name} is both a @tool "
                             "and a @subagent; give one of them another name")
    return found


class SubagentCall(msgspec.Struct, frozen=True):
    """A subagent call a step asks the runner to play (``info["subagent_calls"]``)."""

    thread_id: str
    """The new thread's id ("1", "2", "1.1", ...; see the module doc)."""
    parent: str
    """The thread whose step made the call."""
    name: str
    """The subagent's name."""
    messages: list[Message]
    """The thread's opening messages: its system prompt and its task."""
    tools: list[dict[str, Any]] = []
    """Function schemas of the subagent's own tools."""
    origin: str = ""
    """The call as written, e.g. ``read_document(doc=2, key='k3f')``."""
    max_turns: int | None = None
    max_tokens: int | None = None


class SubagentResult(msgspec.Struct, frozen=True):
    """What came of a subagent call, for ``complete_step``: its answer, or an error."""

    thread_id: str
    answer: str | None = None
    """The thread's final reply; None when it gave none."""
    error: str | None = None
    """Why there is no answer (a limit, a refusal), in words the caller's model reads."""
    error_kind: str | None = None
    """The failure's short kind (``max_turns``, ``depth_limit``, ...)."""


def result_message(result: SubagentResult, name: str) -> Message:
    """The tool message the caller reads: the answer, or ``Error (subagent_<kind>): ...``."""
    if result.answer is not None:
        return Message("tool", result.answer, name)
    kind = f"subagent_{result.error_kind or 'failed'}"
    return Message("tool", f"Error ({kind}): {result.error or 'the subagent gave no answer'}",
                   name)


def call_origin(name: str, arguments: dict[str, Any]) -> str:
    """A call in words: ``read_document(doc=2, key='k3f')`` (values shortened)."""
    args = ", ".join(f"{k}={short_repr(v, 60)}" for k, v in arguments.items())
    return f"{name}({args})"


class ThreadState:
    """One subagent thread as the environment keeps it: its conversation and turns."""

    def __init__(self, thread_id: str, bound: BoundSubagent, messages: list[Message],
                 max_turns: int, arguments: dict[str, Any] | None = None) -> None:
        """A thread that starts from ``messages`` (its system prompt and task);
        ``arguments``: those of the call that started it."""
        self.thread_id = thread_id
        self.bound = bound
        self.arguments = dict(arguments or {})
        self.history = list(messages)
        self.max_turns = max_turns
        self.turn = 0
        self.done = False


class PendingStep(msgspec.Struct):
    """A step waiting for its subagents: the observation with holes where they answer."""

    observation: list[Message | None]
    calls: list[SubagentCall]
    names: dict[str, str]
    """thread id -> subagent name (the tool message's name)."""
    info: dict[str, Any]


class ThreadBook:
    """The environment's record of its subagent threads for one episode."""

    def __init__(self) -> None:
        """No thread yet (``AgentEnv.reset`` starts a new book)."""
        self.threads: dict[str, ThreadState] = {}
        self.pending: dict[str, PendingStep] = {}
        self.num_children: dict[str, int] = {}

    def new_id(self, parent: str) -> str:
        """The next child id of ``parent`` ("3" under main, "3.1" under "3")."""
        count = self.num_children.get(parent, 0) + 1
        self.num_children[parent] = count
        return str(count) if parent == MAIN_THREAD else f"{parent}.{count}"

    def open(self, parent: str, bound: BoundSubagent, task: str, arguments: dict[str, Any],
             schemas: list[dict[str, Any]], default_max_turns: int) -> SubagentCall:
        """Start a thread for one subagent call; returns the call for the runner."""
        spec = bound.spec
        thread_id = self.new_id(parent)
        messages = [Message("system", spec.system), Message("user", task)]
        max_turns = spec.max_turns or default_max_turns
        self.threads[thread_id] = ThreadState(thread_id, bound, messages, max_turns, arguments)
        return SubagentCall(thread_id, parent, spec.tool.name,
                            [msgspec.structs.replace(m) for m in messages], schemas,
                            call_origin(spec.tool.name, arguments), max_turns,
                            spec.max_tokens)

    def state(self, thread_id: str) -> ThreadState:
        """A running thread; ValueError naming the thread when it is unknown or over."""
        state = self.threads.get(thread_id)
        if state is None:
            raise ValueError(f"no subagent thread {thread_id!r} was started in this episode "
                             f"(threads: {sorted(self.threads) or 'none'})")
        if state.done:
            raise ValueError(f"subagent thread {thread_id!r} has already ended")
        return state

    def take_pending(self, thread_id: str, results: list[SubagentResult],
                     max_chars: int) -> tuple[list[Message], dict[str, Any]]:
        """The waiting step's observation with each result in its call's place (an answer
        cut to ``max_chars`` like any tool output), and the step's info."""
        pending = self.pending.get(thread_id)
        if pending is None:
            raise ValueError(f"complete_step({thread_id!r}): that thread has no step waiting "
                             "for subagent results")
        expected = [c.thread_id for c in pending.calls]
        given = [getattr(r, "thread_id", None) for r in results]
        if given != expected:
            raise ValueError(f"complete_step({thread_id!r}): results for threads {given}, "
                             f"expected {expected} in that order")
        del self.pending[thread_id]
        answers = iter(result_message(r, pending.names[r.thread_id]) for r in results)
        observation = [m if m is not None else next(answers) for m in pending.observation]
        for message in observation:
            message.content = valid_utf8(clip(message.content, max_chars, "the answer"))
        return observation, pending.info
