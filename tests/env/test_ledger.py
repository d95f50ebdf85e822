"""Ledger: the answer needs the first page's entry, which only a summary carries past
compaction; its scripted policy, summaries, grading and knobs."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.model.tiny import tiny_tokenizer
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.types import Message
from environments.ledger import LAST_PAGE, LedgerEnv

LEDGER_CONFIG = "configs/ledger.toml"


def play_script(env: LedgerEnv, seed: int = 0) -> tuple[float, dict]:
    """The scripted policy from reset to the answer."""
    env.reset(seed=seed)
    while True:
        _, reward, done, truncated, info = env.step(env.demonstrate(env.history))
        if done or truncated:
            return reward, info


def test_entries_sit_on_the_first_and_last_page_and_the_script_answers_them():
    env = LedgerEnv(num_pages=5, num_facts=3, filler_words=4)
    env.reset(seed=1)
    words = env.task.answer["words"]
    entry_pages = [i for i, p in enumerate(env.pages) if "Entry: " in p]
    assert len(words) == 3 and entry_pages[0] == 0 and entry_pages[-1] == 4
    assert LAST_PAGE in env.pages[-1] and LAST_PAGE not in env.pages[0]
    assert env.needed_facts() == words
    reward, info = play_script(env, seed=1)
    assert reward == 1.0 and info["reward_components"]["correct"] == 1.0


@pytest.mark.parametrize("answer, reward, correct", [
    ("<answer>{0} {1}</answer>", 1.0, 1.0),
    ("<answer>{1} {0}</answer>", 0.0, 0.0),  # order matters
    ("<answer>amber {1}</answer>", 0.5, 0.0),  # the first entry guessed
    ("<answer>{0}</answer>", 0.5, 0.0),
    ("<answer>{0} {1} {1}</answer>", 1.0, 0.0),  # an extra word is not correct
])
def test_grading_gives_credit_per_entry_and_correct_needs_all(answer, reward, correct):
    env = LedgerEnv(num_pages=3, num_facts=2, filler_words=2, num_words=24)
    for seed in range(50):  # a task whose first entry is not "amber"
        env.reset(seed=seed)
        if env.task.answer["words"][0] != "amber" and len(set(env.task.answer["words"])) == 2:
            break
    words = env.task.answer["words"]
    grade = env.grade(answer.format(*words))
    assert (grade.reward, grade.components["correct"]) == (reward, correct)


def test_summaries_carry_every_entry_seen_and_compact_only_after_an_entry_page():
    env = LedgerEnv(num_pages=4, num_facts=2, filler_words=2)
    env.reset(seed=0)
    first = env.task.answer["words"][0]
    env.step(env.demonstrate(env.history))  # page 1: an entry
    assert env.demonstrate_summary(env.history, forced=False) == f"Kept: {first}."
    env.step(env.demonstrate(env.history))  # page 2: none
    assert env.demonstrate_summary(env.history, forced=False) is None
    assert env.demonstrate_summary(env.history, forced=True) == f"Kept: {first}."
    assert LedgerEnv().demonstrate_summary([Message("user", "hi")], True) == \
        "Kept: nothing yet."


def test_knobs_are_checked_with_the_reason():
    with pytest.raises(ValueError, match="num_facts <= num_pages"):
        LedgerEnv(num_pages=2, num_facts=3)
    with pytest.raises(ValueError, match="num_words"):
        LedgerEnv(num_words=1)


def test_the_shipped_config_makes_traces_of_four_budgets_and_more():
    """configs/ledger.toml's whole trace (played without compaction) is at least 4x its
    compaction.max_context_tokens, in the shipped warm start's tokens."""
    config = load_config(LEDGER_CONFIG)
    tokenizer = tiny_tokenizer(0, 1024, None, 4096, "compact")
    if config.model.path:
        from agentrl.model import load_tokenizer

        tokenizer = load_tokenizer(config.model.path)
    whole = msgspec.structs.replace(
        config, compaction=msgspec.structs.replace(config.compaction, strategy="none"),
        rollout=msgspec.structs.replace(config.rollout, max_rollout_tokens=100_000,
                                        max_new_tokens=512))
    rollouts = asyncio.run(play_demonstrations(whole, tokenizer, 4, seed=0))
    budget = config.compaction.max_context_tokens
    assert all(len(r.segments[0].token_ids) >= 4 * budget for r in rollouts)


def test_check_env_passes(capsys):
    assert main(["check-env", "agentrl/Ledger-v0"]) == 0
    assert "Entry:" in capsys.readouterr().out


@pytest.mark.parametrize("strategy, survives", [("drop_oldest", False), ("summarize", True),
                                               ("tool", True)])
def test_dropping_old_turns_loses_the_first_entry_and_a_summary_keeps_it(strategy, survives):
    """The compacted contexts of scripted episodes: after drop_oldest the first page's
    entry is gone from the context (measured by the compaction records), after a
    summary it is still there."""
    config = load_config(LEDGER_CONFIG, [f'compaction.strategy="{strategy}"'])
    tokenizer = tiny_tokenizer(0, 1024, None, 4096, "compact")
    if config.model.path:
        from agentrl.model import load_tokenizer

        tokenizer = load_tokenizer(config.model.path)
    rollouts = asyncio.run(play_demonstrations(config, tokenizer, 3, seed=0))
    for rollout in rollouts:
        first = rollout.stats.needed_facts[0]
        last = rollout.stats.compactions[-1]
        assert last.facts_revealed[0] == first
        assert (first in last.facts_kept) is survives


def test_a_compact_share_below_one_leaves_some_demonstrations_to_the_budget():
    """``compact_share``: that share of the tool strategy's demonstrations call compact
    themselves; the others are compacted by the budget only (drop_oldest) and so lose
    the first entry; the draw is stable per rollout id, and the demonstrations come back
    in rollout-id order whatever order they finished in (a reproducible warm start)."""
    config = load_config(LEDGER_CONFIG, ['compaction.strategy="tool"',
                                         'compaction.fallback="drop_oldest"'])
    from agentrl.model import load_tokenizer

    tokenizer = load_tokenizer(config.model.path)

    def by_tool(share: float) -> dict[str, bool]:
        rollouts = asyncio.run(play_demonstrations(config, tokenizer, 12, seed=0,
                                                   compact_share=share))
        kept_first = {r.rollout_id: r.stats.needed_facts[0] in r.stats.compactions[-1].facts_kept
                      for r in rollouts}
        tool = {r.rollout_id for r in rollouts
                if "tool" in {c.strategy for c in r.stats.compactions}}
        assert all(kept_first[r] for r in tool)  # a compact call carries the first entry
        if share == 0.0:  # the budget alone drops it (unless the last page repeats it)
            assert sum(kept_first.values()) <= len(rollouts) // 4
        return {r.rollout_id: "tool" in {c.strategy for c in r.stats.compactions}
                for r in rollouts}

    half = by_tool(0.5)
    assert 0 < sum(half.values()) < len(half)
    assert list(by_tool(0.5).items()) == list(half.items())  # the same rollouts, in order
    assert not any(by_tool(0.0).values()) and all(by_tool(1.0).values())
    with pytest.raises(ValueError, match="compact_share is 1.5"):
        asyncio.run(play_demonstrations(config, tokenizer, 1, seed=0, compact_share=1.5))
