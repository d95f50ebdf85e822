"""Rollouts become rows: reward copied onto every row, validity the minimum over rows."""

from agentrl.reassembler import rollout_validity, to_rows
from tests.factories import rollout


def test_every_row_carries_the_reward_and_segment_tokens():
    r = rollout("r", "G", 0.75, num_rows=3)
    r.segments[2].token_ids = [9, 9, 9, 9, 9]
    rows = to_rows([r])
    assert [row.segment for row in rows] == [0, 1, 2]
    assert {row.reward for row in rows} == {0.75}
    assert rows[2].token_ids == [9, 9, 9, 9, 9]
    assert rows[0].num_prompt_tokens == 3
    assert sum(row.num_generated_tokens for row in rows) == r.num_generated_tokens


def test_validity_is_the_minimum_over_rows():
    good = rollout("a", "G", 1.0, num_rows=2)
    bad = rollout("b", "G", 1.0, num_rows=2)
    bad.valid = False
    rows = to_rows([good, bad])
    assert rollout_validity(rows) == {"a": True, "b": False}
    # Also when the rows themselves disagree (rows built elsewhere):
    rows = to_rows([good])
    rows[1].valid = False
    assert rollout_validity(rows) == {"a": False}


def test_rows_keep_their_thread_and_every_thread_shares_the_reward():
    from agentrl.types import MAIN_THREAD, Thread

    r = rollout("r", "G", 0.5, num_rows=4)
    r.segments[1].thread = r.segments[2].thread = "sub-0"
    r.segments[3].thread = "sub-0.0"
    r.threads = [Thread("sub-0"), Thread("sub-0.0", parent="sub-0", depth=2)]
    r.valid = False  # a failed grandchild makes the rollout invalid: every row is masked
    rows = to_rows([r])
    assert [row.thread for row in rows] == [MAIN_THREAD, "sub-0", "sub-0", "sub-0.0"]
    assert {row.reward for row in rows} == {0.5}
    assert not any(row.valid for row in rows)
    assert rollout_validity(rows) == {"r": False}
