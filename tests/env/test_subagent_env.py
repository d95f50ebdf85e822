"""The environment's side of subagents: ``@subagent``, the waiting step, thread turns.

A subagent call is offered like a tool (its schema from hints and docstring), its method
builds the task text, the step that made it waits for ``complete_step``, and each thread
keeps its own tools, turns and conversation (see ``agentrl.envs.subagents``).
"""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.envs import AgentEnv, Task, format_call, subagent, tool
from agentrl.envs.subagents import SubagentCall, SubagentResult
from agentrl.types import Message


class Library(AgentEnv):
    """A tiny delegation environment: ``ask`` hands a shelf to a reader with ``read``."""

    max_turns = 4
    main_tools = ("ask", "note")

    @tool
    def read(self, shelf: int) -> str:
        """Read one shelf.

        Args:
            shelf: Which shelf.
        """
        return f"shelf {shelf} holds {self.task.answer[shelf]}"

    @tool
    def note(self, text: str) -> str:
        """Write a note.

        Args:
            text: The note.
        """
        return f"noted {text}"

    @subagent(system="You read shelves.", tools=("read", "ask"), max_turns=3)
    def ask(self, shelf: int) -> str:
        """A reader looks at one shelf.

        Args:
            shelf: The shelf to read.
        """
        if shelf < 0:
            raise ValueError("shelves are numbered from 0")
        return f"What is on shelf {shelf}?"

    def sample_task(self, rng: np.random.Generator) -> Task:
        books = [f"book{int(rng.integers(100))}" for _ in range(3)]
        return Task([Message("system", "Find books."), Message("user", "Which books?")],
                    books, key=" ".join(books))

    def grade(self, answer: str) -> float:
        return float(all(b in answer for b in self.task.answer))


def test_a_subagent_is_offered_like_a_tool_with_its_own_tool_set() -> None:
    env = Library()
    names = [s["function"]["name"] for s in env.tool_schemas()]
    assert names == ["ask", "note"]  # main_tools: read is the readers' only
    ask = env.tool_schemas()[0]["function"]
    assert ask["description"] == "A reader looks at one shelf."
    assert ask["parameters"]["properties"]["shelf"] == {"type": "integer",
                                                        "description": "The shelf to read."}
    env.reset(seed=1)
    _, _, _, _, info = env.step(format_call("ask", shelf=0))
    (call,) = info["subagent_calls"]
    assert [t["function"]["name"] for t in call.tools] == ["read", "ask"]
    assert call.messages == [Message("system", "You read shelves."),
                             Message("user", "What is on shelf 0?")]
    assert (call.thread_id, call.parent, call.origin, call.max_turns) == (
        "1", "main", "ask(shelf=0)", 3)


def test_the_step_waits_and_answers_take_their_calls_places() -> None:
    env = Library()
    env.reset(seed=2)
    action = (format_call("note", text="start") + format_call("ask", shelf=0)
              + format_call("ask", shelf=-1) + format_call("ask", shelf=2))
    observation, reward, terminated, truncated, info = env.step(action)
    assert (observation, reward, terminated, truncated) == ([], 0.0, False, False)
    calls = info["subagent_calls"]
    assert [c.thread_id for c in calls] == ["1", "2"]  # the raising call started nothing
    assert info["tool_errors"] == {"tool_exception": 1}
    with pytest.raises(ValueError, match="waits for its subagents"):
        env.step("too early")
    # thread 1 reads its shelf and answers; thread 2 starts a nested reader
    assert env.thread_step("1", format_call("read", shelf=0))[0][0].content.startswith(
        "shelf 0 holds")
    answer = env.thread_step("1", "  it is the first book  ")
    assert answer[2] is True and answer[4]["answer"] == "it is the first book"
    nested = env.thread_step("2", format_call("ask", shelf=1))[4]["subagent_calls"]
    assert [(c.thread_id, c.parent) for c in nested] == [("2.1", "2")]
    done = env.complete_step("2", [SubagentResult("2.1", error="gave up",
                                                  error_kind="max_turns")])
    assert done[0] == [Message("tool", "Error (subagent_max_turns): gave up", "ask")]
    with pytest.raises(ValueError, match=r"expected \['1', '2'\]"):
        env.complete_step("main", [SubagentResult("2", answer="x")])
    observation, *_ = env.complete_step("main", [SubagentResult("1", answer="A" * 20_000),
                                                 SubagentResult("2", answer="B")])
    assert [m.name for m in observation] == ["note", "ask", "ask", "ask"]
    assert observation[0].content == "noted start"
    assert observation[1].content.startswith("A") and len(observation[1].content) <= (
        env.max_tool_output_chars)  # an answer is cut like any tool output
    assert observation[2].content.startswith("Error (tool_exception)")
    assert observation[3].content == "B"
    assert env.step(" ".join(env.task.answer))[1] == 1.0


def test_thread_turn_limits_histories_and_unknown_threads() -> None:
    env = Library()
    env.reset(seed=3)
    env.step(format_call("ask", shelf=1))
    for _ in range(3):
        _, reward, terminated, truncated, _ = env.thread_step("1", format_call("read", shelf=1))
        assert reward == 0.0 and not terminated
    assert truncated  # max_turns=3 of the @subagent
    with pytest.raises(ValueError, match="already ended"):
        env.thread_step("1", "late")
    with pytest.raises(ValueError, match="no subagent thread '9'"):
        env.thread_step("9", "hello")
    history = env.thread_history("1")
    assert [m.role for m in history] == ["system", "user"] + ["assistant", "tool"] * 3
    env.reset(seed=3)  # a new episode forgets the threads and their ids
    assert env.step(format_call("ask", shelf=1))[4]["subagent_calls"][0].thread_id == "1"


def test_declarations_that_cannot_work_are_refused_naming_the_fix() -> None:
    class Broken(Library):
        @subagent(system="s", tools=("search",))
        def helper(self, x: int) -> str:
            """Help.

            Args:
                x: A number.
            """
            return str(x)

    with pytest.raises(ValueError, match=r"helper names tools \['search'\]"):
        Broken()
    def returns_int(self, x: int) -> int:
        """Nothing."""
        return x

    with pytest.raises(ValueError, match="return annotation must be str"):
        subagent(system="s")(returns_int)
    with pytest.raises(ValueError, match="max_turns is 0"):
        subagent(system="s", max_turns=0)


def test_the_call_carries_what_the_runner_needs_and_pickles() -> None:
    import pickle

    env = Library()
    env.reset(seed=4)
    call = env.step(format_call("ask", shelf=2))[4]["subagent_calls"][0]
    assert isinstance(call, SubagentCall)
    assert pickle.loads(pickle.dumps(call)) == call  # process isolation sends it over a pipe
