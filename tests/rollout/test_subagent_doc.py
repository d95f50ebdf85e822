"""docs/writing-environments.md's subagent example, run: the page's code gives LogSearch a
reader subagent in a few lines, and its tree plays through the rollout runner."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.rollout.demonstrations import DemoEngine
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout

ROOT = Path(__file__).resolve().parents[2]


def page_example() -> type:
    """The class the page defines, built from the page's code block."""
    text = (ROOT / "docs" / "writing-environments.md").read_text()
    code = re.search(r"<!-- subagent example -->\n```python\n(.*?)```", text, re.S).group(1)
    sys.path.insert(0, str(ROOT / "examples" / "logsearch"))
    try:
        namespace: dict = {}
        exec(compile(code, "writing-environments.md", "exec"), namespace)  # noqa: S102
    finally:
        sys.path.remove(str(ROOT / "examples" / "logsearch"))
    return namespace["DelegatingLogSearchEnv"]


def scripted(env, thread_id: str) -> str:
    """The page's own demonstrate() plays every thread of the tree."""
    return env.demonstrate(env.thread_history(thread_id))


def test_the_pages_subagent_example_plays_a_tree(tokenizer) -> None:
    env = page_example()()
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["ask_reader"]
    engine = DemoEngine(tokenizer)
    spec = RolloutSpec("r0", "g0", "logsearch", task_seed=4)
    engine.playing["r0"] = ("logsearch", env, scripted)
    rollout = asyncio.run(play_rollout(spec, env, engine, tokenizer,
                                       RolloutConfig(max_new_tokens=200), CompactionConfig()))
    assert rollout.valid and rollout.reward == 1.0
    (thread,) = rollout.threads
    assert thread.origin == "ask_reader(question='Which service failed?')"
    assert thread.answer == env.task.answer["service"]
    assert thread.stats.num_turns == 3  # grep, read, answer: in the reader's own context
    assert [s.thread for s in rollout.segments] == ["main", "1"]
