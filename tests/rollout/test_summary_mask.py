"""``loss.summary_tokens``: "mask" takes a compaction summary's generated tokens out of
the loss (the tool's ``compact`` reply and a ``summarize`` summary), and nothing else;
"train" keeps the rows exactly as the segments hold them. The update's token count N
counts only trained tokens (invariant 4)."""

from __future__ import annotations

import pytest

from agentrl.advantage import compute_advantages
from agentrl.config import CompactionConfig, load_config
from agentrl.observe.metrics import step_stats
from agentrl.packing import collate
from agentrl.reassembler import to_rows
from agentrl.rollout.compact_tool import find_compact_call
from agentrl.types import Rollout
from tests.rollout.stand_ins import ScriptedEngine
from tests.rollout.test_compact_tool import FactEnv, compact_call, play, scripted


@pytest.fixture
def compacted(tokenizer):
    """A rollout with rows ended by compact(A), compact(B), two budget summaries, and a
    last row with no summary; and a 1-row rollout of the same group with reward 0."""
    plan = ["probe", compact_call("A: saw fact-1"), "probe", compact_call("B: fact-1 fact-2"),
            "probe", "probe", "probe", "probe win"]
    engine = ScriptedEngine(tokenizer, scripted(tokenizer, plan))
    compaction = CompactionConfig(strategy="tool", fallback="summarize", keep_last_turns=0,
                                  max_context_tokens=640, max_compactions=5)
    rollout = play(engine, FactEnv(horizon=6, obs_len=30), tokenizer, compaction)
    assert rollout.valid and rollout.reward == 1.0
    causes = [c.cause for c in rollout.stats.compactions]
    assert causes == ["tool", "tool", "budget", "budget"] and len(rollout.segments) == 5
    other = Rollout("s0-g0-r1", "s0-g0", "long", [rollout.segments[-1]], 0.0)
    return rollout, other


def masked_text(tokenizer, segment, row) -> str:
    return tokenizer.decode([t for t, before, after in zip(
        segment.token_ids, segment.loss_mask, row.loss_mask, strict=True) if before > after])


def test_train_leaves_every_row_as_its_segment(compacted):
    rollout, other = compacted
    for row, segment in zip(to_rows([rollout, other], "train"),
                            [*rollout.segments, *other.segments], strict=True):
        assert row.loss_mask == segment.loss_mask and row.logprobs == segment.logprobs
    assert [r.loss_mask for r in to_rows([rollout])] == \
        [r.loss_mask for r in to_rows([rollout], "train")]  # the default is "train"


def test_mask_untrains_exactly_the_summaries(tokenizer, compacted):
    rollout, other = compacted
    summaries = [s.num_summary_tokens for s in rollout.segments]
    assert all(summaries[:4]) and summaries[-1] == 0
    rows = to_rows([rollout, other], "mask")
    for index, (row, segment) in enumerate(zip(rows, rollout.segments, strict=False)):
        assert row.token_ids == segment.token_ids and row.reward == 1.0
        untrained = [i for i, (a, b) in enumerate(zip(segment.loss_mask, row.loss_mask,
                                                      strict=True)) if a != b]
        # the summary is the row's last generated tokens, all of them masked, nothing else
        generated = [i for i, m in enumerate(segment.loss_mask) if m]
        assert untrained == generated[len(generated) - summaries[index]:]
        assert all(row.logprobs[i] == 0.0 for i in untrained)
        assert sum(row.loss_mask) == segment.num_generated_tokens - summaries[index]
        assert sum(row.loss_mask) > 0  # the probes before the summary are still trained
    for index, summary in ((0, "A: saw fact-1"), (1, "B: fact-1 fact-2")):
        text = masked_text(tokenizer, rollout.segments[index], rows[index])
        assert summary in text and find_compact_call(text) is not None
    for index in (2, 3):
        text = masked_text(tokenizer, rollout.segments[index], rows[index])
        assert text.startswith("SUMMARY-BY-BUDGET")
    assert rows[4].loss_mask == rollout.segments[4].loss_mask  # no summary: unchanged
    assert rows[5].loss_mask == other.segments[0].loss_mask


def test_mask_counts_only_trained_tokens_in_n_and_keeps_the_advantages(compacted):
    rollout, other = compacted
    trained, masked = to_rows([rollout, other], "train"), to_rows([rollout, other], "mask")
    num_summary = sum(s.num_summary_tokens for s in rollout.segments)
    adv_trained, adv_masked = compute_advantages(trained), compute_advantages(masked)
    assert adv_trained == adv_masked  # one advantage per rollout, whatever the mask
    full = collate(trained, adv_trained, list(range(len(trained))))
    part = collate(masked, adv_masked, list(range(len(masked))))
    assert part.num_tokens == full.num_tokens - num_summary  # N: trained tokens only
    on = part.loss_mask > 0
    assert torch_equal(part.advantages[on], full.advantages[on])
    stats = {mode: step_stats(1, [rollout, other], mode).total for mode in ("train", "mask")}
    assert stats["train"].num_trainable_tokens == full.num_tokens
    assert stats["mask"].num_trainable_tokens == part.num_tokens
    assert stats["mask"].num_sampled_tokens == stats["train"].num_sampled_tokens


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_an_unknown_setting_is_refused_naming_it(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[environments]]\nid = "tests.rollout.eval_envs:SayYes"\n')
    assert load_config(path, ['loss.summary_tokens="mask"']).loss.summary_tokens == "mask"
    assert load_config(path).loss.summary_tokens == "train"
    with pytest.raises(ValueError, match="summary_tokens"):
        load_config(path, ['loss.summary_tokens="drop"'])
    with pytest.raises(ValueError, match="summary_tokens"):
        to_rows([], "drop")

