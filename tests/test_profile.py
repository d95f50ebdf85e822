"""``agentrl train --profile``: where a step's time goes, per section, and a torch.profiler
trace of one step on request."""

from __future__ import annotations

import json
import threading
import time

from agentrl.cli import main
from agentrl.model import build_tiny_checkpoint
from agentrl.observe.profile import (
    PROFILER,
    SECTIONS,
    Profiler,
    format_table,
    section,
    step_profile,
)
from tests.train.test_train_e2e import CONFIG


def test_sections_add_up_from_any_thread_and_cost_nothing_when_off():
    profiler = Profiler()
    with profiler.section("engine/forward"):  # off: not timed
        time.sleep(0.01)
    assert profiler.take() == {}
    profiler.enable()
    with profiler.section("engine/forward"):
        time.sleep(0.02)
    worker = threading.Thread(target=lambda: profiler.add("rollout/env", 0.5))
    worker.start()
    worker.join()
    seconds = profiler.take()
    assert seconds["engine/forward"] >= 0.02 and seconds["rollout/env"] == 0.5
    assert profiler.take() == {}  # take starts again from zero


def test_step_profile_derives_scheduling_and_forward():
    seconds = {"engine/forward": 1.0, "engine/sampling": 0.5, "rollout/env": 0.25,
               "train/forward_backward": 3.0, "train/backward": 2.0}
    figures = step_profile(seconds, {"generate": 2.0, "other": 0.1, "sync": 0.2})
    assert figures["profile/rollout/scheduling"] == 0.25  # 2.0 - 1.75 no section claimed
    assert figures["profile/train/forward"] == 1.0  # forward_backward less backward
    assert figures["profile/train/prepare"] == 0.1 and figures["profile/sync"] == 0.2
    assert set(figures) == {f"profile/{name}" for name in SECTIONS}
    table = format_table([figures, figures])
    assert "mean of 2 step(s)" in table and "engine/forward" in table


# the end-to-end config made small: one prompt of two samples a step, one turn of 3 new
# tokens, one update, no checkpoint (the traced step runs several times slower)
SMALL = ["rollout.max_new_tokens=3", "rollout.max_turns=1", "batch.rollout_batch_size=1",
         "train.checkpoint_every=0"]


def test_train_profile_writes_sections_and_a_trace(tmp_path, capsys):
    model = build_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                                  num_kv_heads=1, vocab_size=300)
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(model=model, budget=4096, steps=2, eval_every=0))
    out = tmp_path / "run"
    small = [arg for override in SMALL for arg in ("--set", override)]
    try:
        assert main(["train", str(config), "--out", str(out), "--profile",
                     "--profile-trace", "2", *small]) == 0
    finally:
        PROFILER.disable()
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1, 2]
    for step in steps:
        assert step["profile/engine/forward"] > 0 and step["profile/train/backward"] > 0
        assert step["profile/train/optimizer"] > 0 and step["profile/rollout/tokenizer"] > 0
        assert step["profile/rollout/env"] > 0  # the environment's calls, on their threads
    assert "profile: mean of 2 step(s)" in capsys.readouterr().out
    trace = json.loads((out / "profile" / "step_2.trace.json").read_text())
    assert trace["traceEvents"]
    assert "aten::" in (out / "profile" / "step_2.ops.txt").read_text()
    assert not (out / "profile" / "step_1.trace.json").exists()


def test_section_is_a_no_op_by_default():
    assert not PROFILER.enabled
    with section("train/packing"):
        pass
    assert PROFILER.take() == {}
