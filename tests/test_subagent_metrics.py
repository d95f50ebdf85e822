"""Subagent figures per environment, by hand: threads per rollout, calls, depth, the
subagents' share of generated tokens, failures by reason (every reason, 0 included)."""

from __future__ import annotations

import pytest

from agentrl.observe.metrics import rollout_figures, subagent_figures
from agentrl.types import SUBAGENT_FAILURES, Rollout, Thread
from tests.factories import segment


def _tree() -> Rollout:
    """Main 3 generated tokens; threads 1 (2 tokens) and 1.1 (4 tokens, depth 2) ran, a
    third call was refused at the depth limit, thread 2 looped out of turns (1 token)."""
    segments = [segment(num_generated=3), segment(num_generated=2),
                segment(num_generated=4), segment(num_generated=1)]
    for seg, thread in zip(segments, ["main", "1", "1.1", "2"], strict=True):
        seg.thread = thread
    threads = [Thread("1", answer="x"), Thread("1.1", "1", 2, answer="y"),
               Thread("1.1.1", "1.1", 3, error="too deep", error_kind="depth_limit"),
               Thread("2", error="loops", error_kind="max_turns")]
    return Rollout("a", "g", "e", segments, 1.0, threads=threads)


def test_subagent_figures_by_hand() -> None:
    plain = Rollout("b", "g", "e", [segment(num_generated=5)], 0.0)
    figures = subagent_figures([_tree(), plain], "env/e/")
    assert figures["env/e/subagents/threads_per_rollout/mean"] == (4 + 1) / 2
    assert figures["env/e/subagents/calls_per_rollout/mean"] == 4 / 2
    assert figures["env/e/subagents/depth/mean"] == (2 + 0) / 2
    assert figures["env/e/subagents/depth/max"] == 2.0  # the refused call ran nothing
    assert figures["env/e/subagents/generated_token_share"] == pytest.approx(7 / 15)
    failures = {k.rsplit("/", 1)[1]: v for k, v in figures.items() if "/failures/" in k}
    assert failures == {**dict.fromkeys(SUBAGENT_FAILURES, 0.0), "depth_limit": 1.0,
                        "max_turns": 1.0}
    assert subagent_figures([plain]) == {}  # no tree, no figures
    assert "subagents/depth/max" in rollout_figures([_tree()])
