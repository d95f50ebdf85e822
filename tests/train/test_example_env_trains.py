"""The README's example environment trains in the quickstart mix.

``examples/custom_env/quickstart_mix.toml`` is the quickstart plus ReverseWord: its other
sections must stay the quickstart's (checked here, so the two cannot drift), and a short
run of it must train on ReverseWord rollouts next to the built-ins.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from agentrl.cli import main
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parents[2]
MIX = ROOT / "examples" / "custom_env" / "quickstart_mix.toml"
QUICKSTART = ROOT / "configs" / "quickstart.toml"


def test_mix_is_the_quickstart_plus_the_example_env():
    mix, quick = tomllib.loads(MIX.read_text()), tomllib.loads(QUICKSTART.read_text())
    assert {k: v for k, v in mix.items() if k != "environments"} == {
        k: v for k, v in quick.items() if k != "environments"}
    assert mix["environments"][: len(quick["environments"])] == quick["environments"]
    assert mix["environments"][-1]["id"].endswith("reverse_word.py:ReverseWordEnv")


def test_example_env_trains_in_the_quickstart_mix(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config names the example by its path in the repo
    out = tmp_path / "run"
    assert main(["train", str(MIX), "--out", str(out), "--set", "train.num_steps=1",
                 "--set", "train.eval_every=0", "--set", "log.live=false",
                 "--set", "batch.rollout_batch_size=9", "--set", "batch.global_batch_size=72",
                 "--set", "train.checkpoint_every=0"]) == 0
    step = read_metrics(out)[0]
    assert step["env/reverse_word/num_rollouts"] == 8
    assert step["num_trainable_tokens"] > 0
    assert (out / "checkpoints" / "step_1" / "config.json").exists()
