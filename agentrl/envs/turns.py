"""An ``AgentEnv``'s tool turns: read the model's reply, run its tool calls (a subagent
call opens a thread and the step waits), record the observation, truncate at the turn
limit. A mixin of :class:`agentrl.envs.agent_env.AgentEnv`, whose ``__init__`` sets the
state these methods read (``parser``, ``tools``, ``subagents``, ``threads``, ``history``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from agentrl.envs.subagents import PendingStep, SubagentCall
from agentrl.envs.tools import BoundTool, run_call
from agentrl.types import MAIN_THREAD, Message


class ToolTurns:
    """The turn machinery shared by the main thread's ``step`` and subagent threads'
    ``thread_step``."""

    def _read_turn(self, history: list[Message], action: str) -> list:
        """Record the model's reply in a thread's history; the tool calls it holds."""
        if not isinstance(action, str):
            raise ValueError(f"action must be the model's text (str), got {type(action)}")
        history.append(Message("assistant", action))
        return self.parser.parse(action)

    def _toolset(self, thread_id: str) -> dict[str, BoundTool]:
        """The tools and subagents a thread may call, by name."""
        if thread_id != MAIN_THREAD:
            return self.named_tools(self.threads.threads[thread_id].bound.spec.tools)
        if self.main_tools is None:
            return self.named_tools([*self.tools, *self.subagents])
        return self.named_tools(self.main_tools)

    def named_tools(self, names: Any) -> dict[str, BoundTool]:
        """These ``@tool`` and ``@subagent`` methods (a subagent as its task builder)."""
        every = {**self.tools, **{n: b.as_tool for n, b in self.subagents.items()}}
        return {name: every[name] for name in names if name in every}

    def _tool_turn(self, thread_id: str, calls: list, info: dict[str, Any]) -> tuple:
        """Run a turn's calls; a turn that started subagents waits for ``complete_step``."""
        observation, subagent_calls = self._run_calls(calls, info, thread_id)
        if not subagent_calls:
            return self._end_turn(thread_id, observation, info)
        names = {c.thread_id: c.name for c in subagent_calls}
        self.threads.pending[thread_id] = PendingStep(observation, subagent_calls, names, info)
        return [], 0.0, False, False, {**info, "subagent_calls": subagent_calls}

    def _end_turn(self, thread_id: str, observation: list[Message], info: dict[str, Any]
                  ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Record a tool turn's observation; truncated at the thread's turn limit."""
        if thread_id == MAIN_THREAD:
            self.history.extend(observation)
            truncated = self._turn >= self.max_turns
            self._done = truncated
        else:
            state = self.threads.threads[thread_id]
            state.history.extend(observation)
            truncated = state.turn >= state.max_turns
            state.done = truncated
        return [msgspec.structs.replace(m) for m in observation], 0.0, False, truncated, info

    def _run_calls(self, calls: list, info: dict[str, Any], thread_id: str = MAIN_THREAD
                   ) -> tuple[list[Any], list[SubagentCall]]:
        """Each call's tool message, in order; a subagent call leaves a hole (None) that
        its answer fills, and opens a thread."""
        errors: Counter[str] = Counter()
        tools = self._toolset(thread_id)
        observation: list[Any] = []
        subagent_calls: list[SubagentCall] = []
        for index, call in enumerate(calls):
            if index >= self.max_tool_calls_per_turn:
                errors["too_many_calls"] += len(calls) - index
                observation.append(Message(
                    "tool", f"Error (too_many_calls): only {self.max_tool_calls_per_turn} "
                    "tool calls run per turn; the rest were skipped", "error"))
                break
            self.calling_thread = thread_id
            try:
                outcome = run_call(tools, call, self.tool_timeout_s,
                                   self.max_tool_output_chars)
            finally:
                self.calling_thread = MAIN_THREAD
            if outcome.error is not None:
                errors[outcome.error] += 1
            elif call.name in self.subagents:  # the result is the subagent's task text
                bound = self.subagents[call.name]
                schemas = [t.spec.schema()
                           for t in self.named_tools(bound.spec.tools).values()]
                subagent_calls.append(self.threads.open(
                    thread_id, bound, outcome.message.content, call.arguments, schemas,
                    self.max_turns))
                observation.append(None)
                continue
            observation.append(outcome.message)
        info["tool_errors"] = dict(errors)
        return observation, subagent_calls
