"""Subagent threads in the runner: a rollout as a tree of conversations under one policy.

Each call of a ``@subagent`` runs its own multi-turn loop (own context, compaction,
budgets), concurrently with its siblings, on the replica its thread key is routed to; its
answer comes back as the tool result. Limits and policy failures come back as error
results the caller recovers from; environment failures inside a thread mask the rollout
with the same kinds and deadlines as any step.
"""

from __future__ import annotations

import asyncio
import functools
import re

import msgspec
import pytest

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.engines.router import EngineRouter
from agentrl.observe.metrics import subagent_figures
from agentrl.reassembler import check_reward_copies, to_rows
from agentrl.rollout.episode import EnvSource, play_episode
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.rollout.request_keys import (
    is_session,
    new_session_key,
    request_key,
    split_key,
)
from agentrl.staleness import StalenessError, check_bound, oldest_version
from agentrl.types import MAIN_THREAD, Group
from tests.rollout.subagent_stand_ins import READER, Archive, TextPolicyEngine

SPEC = RolloutSpec(rollout_id="s1-g0-r0", group_id="s1-g0", env="archive", task_seed=3,
                   sampling_seed=11)
ROLLOUT = RolloutConfig(max_new_tokens=120, max_turns=4, max_rollout_tokens=400,
                        max_subagent_tokens=200, step_timeout_s=2.0, rollout_timeout_s=30.0)


NO_COMPACTION = CompactionConfig()


def play(env, engine, tokenizer, rollout=ROLLOUT, compaction=NO_COMPACTION):
    return asyncio.run(play_rollout(SPEC, env, engine, tokenizer, rollout, compaction))


def test_a_rollout_is_a_tree_whose_answers_come_back_as_tool_results(tokenizer) -> None:
    env, engine = Archive(), TextPolicyEngine(tokenizer)
    rollout = play(env, engine, tokenizer)
    assert rollout.valid and rollout.reward == 1.0
    assert [(t.thread_id, t.parent, t.depth, t.origin) for t in rollout.threads] == [
        ("1", "main", 1, "delegate(shelf=0)"), ("2", "main", 1, "delegate(shelf=1)"),
        ("3", "main", 1, "delegate(shelf=2)")]
    assert [t.answer for t in rollout.threads] == env.task.answer
    # the main thread's rows first, then each thread's, every segment naming its thread
    assert [s.thread for s in rollout.segments] == ["main", "1", "2", "3"]
    final_prompt = tokenizer.decode(rollout.segments[0].token_ids)
    for book in env.task.answer:  # the answers reached the main thread as tool messages
        assert f"<tool_response>\n{book}\n</tool_response>" in final_prompt
    for segment in rollout.segments[1:]:
        assert READER in tokenizer.decode(segment.token_ids[:segment.num_prompt_tokens])
        assert "Name every book" not in tokenizer.decode(segment.token_ids)  # own context
    # counts over the whole tree: 2 main turns + 2 per reader
    assert rollout.stats.num_turns == 8 and [t.stats.num_turns for t in rollout.threads] == [
        2, 2, 2]
    assert rollout.stats.num_generated_tokens == rollout.num_generated_tokens
    rows = to_rows([rollout])
    assert [r.thread for r in rows] == ["main", "1", "2", "3"]
    assert check_reward_copies(rows) == {SPEC.rollout_id: 1.0}


class ShapedArchive(Archive):
    """The documented reward shaping (docs/writing-environments.md): override ``step``
    and add a bonus, here 0.5 on every main-thread step."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward + 0.5, terminated, truncated, info


def test_a_delegating_step_keeps_the_bonus_its_step_added(tokenizer) -> None:
    rollout = play(ShapedArchive(), TextPolicyEngine(tokenizer), tokenizer)
    # two main-thread turns (the delegation, then the answer): 1.0 + 2 x 0.5, not 1.5
    assert rollout.valid and rollout.stats.num_turns - 6 == 2
    assert rollout.reward == 2.0


def test_calls_of_one_turn_run_concurrently_each_thread_on_one_replica(tokenizer) -> None:
    replicas = [TextPolicyEngine(tokenizer, delay_s=0.02) for _ in range(2)]
    router = EngineRouter(replicas)
    rollout = play(Archive(num_shelves=4), router, tokenizer)
    assert rollout.reward == 1.0
    assert max(r.max_in_flight for r in replicas) >= 2  # the readers overlapped
    assert sum(r.max_in_flight for r in replicas) >= 4
    served = {}
    for index, replica in enumerate(replicas):
        for key in replica.keys:
            served.setdefault(key, set()).add(index)
    assert set(served) == {SPEC.rollout_id, *(request_key(SPEC.rollout_id, t)
                                              for t in ("1", "2", "3", "4"))}
    assert all(len(where) == 1 for where in served.values())  # router affinity per thread
    assert len({next(iter(w)) for w in served.values()}) == 2  # the threads spread out
    assert split_key(request_key("r7", "2.1")) == ("r7", "2.1")
    assert split_key("r7") == ("r7", MAIN_THREAD)
    rollout_id, part = split_key(new_session_key("s0-g0-r1"))  # an agent program's key:
    assert rollout_id == "s0-g0-r1" and is_session(part)  # the same format, a session
    assert not is_session(split_key(request_key("s0-g0-r1", "2.1"))[1])


def test_each_thread_has_its_own_context_window_and_compaction(tokenizer) -> None:
    env, engine = Archive(padding=20), TextPolicyEngine(tokenizer, mode="loop")
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=760,
                                  keep_last_turns=1, max_compactions=8)
    rollout = play(env, engine, tokenizer, msgspec.structs.replace(ROLLOUT, max_turns=4),
                   compaction)
    main_segments = [s for s in rollout.segments if s.thread == MAIN_THREAD]
    assert len(main_segments) == 1  # the main thread never outgrew its window
    for thread in rollout.threads:
        mine = [s for s in rollout.segments if s.thread == thread.thread_id]
        assert thread.stats.num_compactions >= 1 and len(mine) == 1 + (
            thread.stats.num_compactions)
        assert all(len(s.token_ids) <= 760 + ROLLOUT.max_new_tokens for s in mine)
        assert all(READER in tokenizer.decode(s.token_ids[:s.num_prompt_tokens]) for s in mine)
    assert rollout.stats.num_compactions == sum(t.stats.num_compactions
                                                for t in rollout.threads)


def test_a_subagent_thread_compacts_by_tool_in_its_own_rows(tokenizer) -> None:
    env, engine = Archive(), TextPolicyEngine(tokenizer, mode="compact")
    compaction = CompactionConfig(strategy="tool", fallback="drop_oldest",
                                  max_context_tokens=4000, keep_last_turns=0)
    rollout = play(env, engine, tokenizer, compaction=compaction)
    assert rollout.valid and rollout.reward == 1.0
    assert [t.answer for t in rollout.threads] == env.task.answer
    threads = [s.thread for s in rollout.segments]
    assert threads == ["main", "1", "1", "2", "2", "3", "3"]  # each reader: 2 rows
    for segment in rollout.segments[1:]:  # every thread is offered the compact tool
        assert '"name": "compact"' in tokenizer.decode(segment.token_ids)
    # the rollout's compactions name its own rows: each ends a reader's first row
    assert [(c.cause, c.segment) for c in rollout.stats.compactions] == [
        ("tool", 1), ("tool", 3), ("tool", 5)]
    assert rollout.stats.num_compactions == 3
    assert all([c.segment for c in t.stats.compactions] == [0] for t in rollout.threads)


def test_limits_and_policy_failures_are_error_results_the_caller_recovers_from(
        tokenizer) -> None:
    limited = msgspec.structs.replace(ROLLOUT, max_subagents_per_rollout=2)
    rollout = play(Archive(), TextPolicyEngine(tokenizer), tokenizer, limited)
    assert rollout.valid and rollout.reward == 0.0  # it answered without the third book
    assert [t.error_kind for t in rollout.threads] == [None, None, "count_limit"]
    assert "Error (subagent_count_limit)" in tokenizer.decode(rollout.segments[0].token_ids)
    assert {s.thread for s in rollout.segments} == {"main", "1", "2"}  # 3 never started

    nested = play(Archive(num_shelves=1), TextPolicyEngine(tokenizer, mode="nest"), tokenizer)
    assert [(t.thread_id, t.depth, t.error_kind) for t in nested.threads] == [
        ("1", 1, None), ("1.1", 2, "depth_limit")]
    assert nested.valid and nested.reward == 1.0  # the reader read the shelf itself

    deeper = msgspec.structs.replace(ROLLOUT, max_subagent_depth=2)
    two = play(Archive(num_shelves=1), TextPolicyEngine(tokenizer, mode="nest"), tokenizer,
               deeper)
    assert [(t.thread_id, t.depth, t.answer is not None) for t in two.threads] == [
        ("1", 1, True), ("1.1", 2, True), ("1.1.1", 3, False)]

    loops = play(Archive(num_shelves=2), TextPolicyEngine(tokenizer, mode="loop"), tokenizer)
    assert loops.valid and [t.error_kind for t in loops.threads] == ["max_turns"] * 2
    assert "gave no answer: it used its 4 turns" in loops.threads[0].error

    budget = msgspec.structs.replace(ROLLOUT, max_subagent_tokens=30)
    spent = play(Archive(num_shelves=2), TextPolicyEngine(tokenizer, mode="loop"), tokenizer,
                 budget)
    assert [t.error_kind for t in spent.threads] == ["max_tokens"] * 2
    assert all(t.stats.num_generated_tokens <= 30 for t in spent.threads)

    bad_call = play(Archive(num_shelves=1), TextPolicyEngine(tokenizer, mode="extra"),
                    tokenizer)
    assert bad_call.valid and len(bad_call.threads) == 1  # delegate(shelf=-1) raised
    assert bad_call.stats.tool_errors == {"tool_exception": 1}
    figures = subagent_figures([rollout, nested, loops, spent, bad_call])
    assert figures["subagents/failures/count_limit"] == 1.0
    assert figures["subagents/failures/depth_limit"] == 1.0
    assert figures["subagents/failures/max_turns"] == 2.0
    assert figures["subagents/failures/max_tokens"] == 2.0
    assert figures["subagents/depth/max"] == 1.0  # a refused call ran no thread


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_thread_whose_environment_step_raised_gives_its_caller_an_error_result(
        tokenizer, isolation) -> None:
    """The readers' thread_step raises: each call returned, so the main thread reads an
    error result per reader and answers without them; the rollout stays valid (reward 0:
    no book named), the readers' rows are trained with it, the failures are counted."""
    source = EnvSource("archive", functools.partial(Archive, fail="raise"), isolation)
    failures = []
    rollout = asyncio.run(play_episode(SPEC, source, TextPolicyEngine(tokenizer), tokenizer,
                                       ROLLOUT, CompactionConfig(),
                                       lambda spec, error: failures.append(error)))
    assert rollout.valid and rollout.trainable and rollout.reward == 0.0 and not failures
    assert [t.error_kind for t in rollout.threads] == ["step_raised"] * 3
    assert rollout.threads[0].error == (
        "the subagent delegate (thread 1) gave no answer: its environment step raised "
        "RuntimeError: the reader's lamp broke.")
    main_text = tokenizer.decode(rollout.segments[0].token_ids)
    assert main_text.count("<tool_response>\nError (subagent_step_raised): the subagent "
                           "delegate") == 3  # one per reader, then the main answer
    assert {s.thread for s in rollout.segments} == {"main", "1", "2", "3"}
    assert subagent_figures([rollout])["subagents/failures/step_raised"] == 3.0


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize(("fail", "kind", "words"), [
    ("hang", "step_timeout", "thread_step() timed out: no return within 0.5 s"),
    ("reward", "bad_reward", "thread_step() of thread '1' returned reward 1.0; a "
                             "subagent's steps earn nothing"),
])
def test_environment_failures_in_a_thread_mask_the_rollout(tokenizer, isolation, fail, kind,
                                                           words) -> None:
    rollout_cfg = msgspec.structs.replace(ROLLOUT, step_timeout_s=0.5)
    source = EnvSource("archive", functools.partial(Archive, fail=fail), isolation)
    failures = []
    rollout = asyncio.run(play_episode(SPEC, source, TextPolicyEngine(tokenizer), tokenizer,
                                       rollout_cfg, CompactionConfig(),
                                       lambda spec, error: failures.append(error)))
    assert not rollout.valid and rollout.stats.error_kind == kind
    assert rollout.stats.error.startswith("subagent thread 1 (delegate(shelf=0)): env "
                                          "'archive': ")
    assert words in rollout.stats.error
    assert [f.kind for f in failures] == [kind]
    first = rollout.threads[0]
    assert first.error_kind == kind
    assert {t.error_kind for t in rollout.threads[1:]} <= {kind}  # cancelled or failed too


def test_a_subagent_that_never_finishes_is_cut_off_by_the_rollout_deadline(tokenizer) -> None:
    hurry = msgspec.structs.replace(ROLLOUT, rollout_timeout_s=1.0)
    rollout = play(Archive(), TextPolicyEngine(tokenizer, hang_keys=True), tokenizer, hurry)
    assert not rollout.valid and rollout.stats.error_kind == "rollout_timeout"
    assert [t.error_kind for t in rollout.threads] == ["rollout_timeout"] * 3
    assert all(t.error.startswith("cut off: rollout timed out") for t in rollout.threads)


def test_every_thread_records_versions_and_the_bound_sees_the_oldest(tokenizer) -> None:
    engine = TextPolicyEngine(tokenizer, bump_versions=True)
    rollout = play(Archive(), engine, tokenizer)
    versions = {s.thread: [v for _, v in s.version_runs] for s in rollout.segments}
    assert set(versions) == {"main", "1", "2", "3"} and all(versions.values())
    oldest = oldest_version(rollout)
    assert oldest == min(v for vs in versions.values() for v in vs) == 0
    newest = max(v for vs in versions.values() for v in vs)
    # the bound looks at the oldest token of any thread: trained at `newest`, a bound that
    # only the subagents' or main's oldest token breaks is named
    group = Group("s1-g0", "archive", [rollout])
    check_bound([group], newest, newest)
    with pytest.raises(StalenessError, match=f"rollout {rollout.rollout_id} "):
        check_bound([group], newest, newest - 1)


def test_process_isolation_plays_the_same_tree(tokenizer) -> None:
    source = EnvSource("archive", functools.partial(Archive), "process")
    rollout = asyncio.run(play_episode(SPEC, source, TextPolicyEngine(tokenizer), tokenizer,
                                       ROLLOUT, CompactionConfig()))
    in_thread = play(Archive(), TextPolicyEngine(tokenizer), tokenizer)
    assert rollout.valid and rollout.reward == 1.0
    assert [s.token_ids for s in rollout.segments] == [s.token_ids for s in in_thread.segments]
    assert re.fullmatch(r"b\d+", rollout.threads[0].answer)


def test_check_env_draws_the_scripted_tree_and_reports_violations_in_training_words(
        tokenizer, capsys) -> None:
    from agentrl.cli import main

    env_id = "tests.rollout.subagent_stand_ins:Archive"
    assert main(["check-env", env_id, "--kwargs", '{"num_shelves": 2}']) == 0
    out = capsys.readouterr().out
    assert "  └─ thread 1 ← delegate(shelf=0)" in out
    assert "    [user] Which book is on shelf 1?" in out
    assert re.search(r"      ↳ returns to thread main: b\d+", out)
    assert "episode 0 (seed 0): reward 1" in out
    assert main(["check-env", env_id, "--kwargs", '{"fail": "reward"}']) == 1
    checked = capsys.readouterr().out.splitlines()[-1]
    source = EnvSource(env_id, functools.partial(Archive, fail="reward"))
    trained = asyncio.run(play_episode(SPEC, source, TextPolicyEngine(tokenizer), tokenizer,
                                       ROLLOUT, CompactionConfig()))
    assert checked == f"violation (bad_reward): {trained.stats.error}"
