"""`agentrl plan` and the memory plan count rollout trees: the subagents each environment
declares, the tokens a rollout can generate across its threads, the longest thread."""

from __future__ import annotations

import pytest

from agentrl import subagent, tool
from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.envs.context_budget import subagent_prompt_tokens
from agentrl.envs.registry import make
from agentrl.memory.plan import describe_memory_plan, plan_memory
from agentrl.model.shapes import KNOWN_SHAPES
from agentrl.train.preflight import run_checks
from agentrl.train.preflight_facts import Preflight
from environments.docqa import READER_SYSTEM, DocQAEnv

DOCQA = "configs/docqa.toml"
TINY = ['model.path=""', "compaction.max_context_tokens=1024"]
"""Plan with the tiny built-in tokenizer (no warm start needed), whose prompts are about
twice as long as those of the fitted tokenizer the config's context is set for."""


def test_plan_names_the_subagents_and_a_rollouts_tokens_across_threads(capsys) -> None:
    assert main(["plan", DOCQA, *[a for o in TINY for a in ("--set", o)]]) == 0
    out = capsys.readouterr().out
    config = load_config(DOCQA, TINY)
    pf = Preflight(config)
    head = pf.subagent_prompts(0)["search_document"]
    pf.close()
    rollout = config.rollout
    total = rollout.max_rollout_tokens + 4 * rollout.max_subagent_tokens
    assert (f"threads: subagents in docqa: search_document ({head} tokens before its "
            "task); a rollout starts at most rollout.max_subagents_per_rollout = 4 of them, "
            "nested at most rollout.max_subagent_depth = 1 deep, and generates at most "
            f"rollout.max_rollout_tokens 200 + 4 x rollout.max_subagent_tokens 120 = {total} "
            "tokens across its threads") in out


def test_without_compaction_the_longest_thread_may_be_a_subagents() -> None:
    config = load_config(DOCQA, [*TINY, 'compaction.strategy="none"',
                                 "rollout.max_rollout_tokens=40",
                                 "rollout.max_subagent_tokens=900"])
    pf = Preflight(config)
    head = subagent_prompt_tokens(pf.environment(0), pf.tokenizer)["search_document"]
    row = pf.longest_row
    pf.close()
    assert row.tokens == head + 900
    assert "docqa's subagent search_document starts from" in row.how
    assert row.knob.startswith("rollout.max_subagent_tokens")


def test_a_subagent_prompt_past_the_context_budget_is_refused() -> None:
    config = load_config(DOCQA, [*TINY, "compaction.max_context_tokens=300",
                                 "batch.max_tokens_per_microbatch=8192"])
    with pytest.raises(ConfigError, match="environment 'docqa': subagent search_document "
                                          r"starts from \d+ tokens .* raise "
                                          "compaction.max_context_tokens"):
        run_checks(config)


class CompactReaderEnv(DocQAEnv):
    """DocQA whose readers have a tool of their own named ``compact``."""

    @tool
    def compact(self, note: str) -> str:
        """Keep a note.

        Args:
            note: The note.
        """
        return note

    @subagent(system=READER_SYSTEM, tools=("read_page", "compact"))
    def search_document(self, doc: int) -> str:
        """A reader for one document.

        Args:
            doc: The document, from 0.
        """
        return f"Find the code in document {doc}."


def test_the_compact_tool_counts_in_every_thread_and_may_not_clash_in_one() -> None:
    def head(strategy: str) -> int:
        pf = Preflight(load_config(DOCQA, [*TINY, f'compaction.strategy="{strategy}"',
                                           'compaction.fallback="drop_oldest"']))
        try:
            return pf.subagent_prompts(0)["search_document"]
        finally:
            pf.close()

    assert head("tool") > head("drop_oldest")  # a reader is offered compact too
    config = load_config(DOCQA, [*TINY, 'compaction.strategy="tool"',
                                 'compaction.fallback="drop_oldest"',
                                 'environments.0.id="tests.test_subagent_plan:CompactReaderEnv"'])
    with pytest.raises(ConfigError, match='environment.s. docqa have one of their own'):
        run_checks(config)


def test_environments_without_subagents_say_so() -> None:
    assert subagent_prompt_tokens(make("agentrl/Countdown-v0"), None) == {}
    lines = run_checks(load_config("configs/quickstart.toml"))
    assert "threads: one per rollout (no environment declares a @subagent)" in lines


def test_the_memory_plan_counts_the_longest_thread_and_a_rollouts_tokens() -> None:
    config = load_config(DOCQA, ['compaction.strategy="none"', "rollout.max_rollout_tokens=64",
                                 "rollout.max_subagent_tokens=3000"])
    plan = plan_memory(config, KNOWN_SHAPES["Qwen2.5-1.5B"], 24)
    kv = next(t for t in plan.terms if t.name == "engine KV cache")
    assert "64 slots × 5048 tokens (the longest thread's request)" in kv.detail
    assert ("generation: a rollout generates at most 12064 tokens across its threads (main 64 "
            "+ 4 subagents x 3000), each thread one request of at most 5048 tokens at a time"
            ) in describe_memory_plan(plan)
