"""docs/writing-environments.md, run: its files are written from the page and its commands
are read from the page and run in order, on a small scale, in an empty folder. The first
training step must complete with compaction firing in the new environment, and the
long-trace environment of section 8 must pass check-env and reach a training step.

The page cannot drift: the files the test writes are the page's code blocks marked
``<!-- file: NAME -->`` (examples/logsearch/ and examples/notebook/ hold the same files),
and the commands are every ``agentrl`` line of its ``bash`` blocks. Scaling down only
appends options (fewer SFT steps and demonstrations, one training step, a smaller
batch, fewer eval tasks; argparse and ``--set`` take the last value given) and reads a
run's last checkpoint as step 1.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agentrl.cli import COMMANDS, main
from agentrl.model.base import GENERIC_BASE
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "writing-environments.md"
EXAMPLE = ROOT / "examples" / "logsearch"
EXAMPLES = {"logsearch.py": EXAMPLE, "logsearch_mix.toml": EXAMPLE,
            "notebook.py": ROOT / "examples" / "notebook",
            "notebook.toml": ROOT / "examples" / "notebook"}
"""Where each of the page's files is kept as an example."""

SMALL = {
    "sft": ["--num-steps", "60", "--num-demonstrations", "160", "--rows-per-step", "16",
            "--copy-steps", "0",
            # a checkout without the generic base: a new tiny model, as its tokenizer is
            # what check-env measured
            *([] if (GENERIC_BASE / "config.json").is_file() else ["--base", "new"])],
    "train": ["--set", "train.num_steps=1", "--set", "log.live=false",
              "--set", "batch.rollout_batch_size=4", "--set", "batch.global_batch_size=32",
              "--set", "train.eval_every=0"],
    "eval": ["--tasks", "4"],
}
"""What each command gets appended to run in well under a minute."""


def scaled(command: list[str]) -> list[str]:
    """A page command at the test's scale: SMALL appended, a run's step 30 read as step 1
    (the one step trained here)."""
    argv = [a.replace("checkpoints/step_30", "checkpoints/step_1") for a in command]
    return argv + SMALL.get(command[0], [])


def doc_files(text: str) -> dict[str, str]:
    """The code blocks marked ``<!-- file: NAME -->``, by file name."""
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S))


def doc_commands(text: str) -> list[list[str]]:
    """Every ``agentrl ...`` command of the page's bash blocks (a trailing ``\\`` continues
    it on the next line), in order, without ``agentrl``
    (and without a trailing ``# comment``)."""
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line, comments=True)[1:] for line in lines
            if line.startswith("agentrl ")]


def unknown_commands(commands: list[list[str]]) -> list[str]:
    """The page's commands the CLI does not have (a typo on the page): none may be skipped."""
    return [c[0] for c in commands if c[0] not in COMMANDS]


def test_the_example_files_are_the_pages_files():
    files = doc_files(DOC.read_text())
    assert set(files) == set(EXAMPLES)
    for name, text in files.items():
        assert (EXAMPLES[name] / name).read_text() == text, f"{name} differs from the page's"


def test_every_command_on_the_page_is_one_the_cli_runs():
    assert unknown_commands(doc_commands(DOC.read_text())) == []
    typo = "```bash\nagentrl check-env x.py:E\nagentrl trian mix.toml\n```\n"
    assert unknown_commands(doc_commands(typo)) == ["trian"]


def test_the_page_uses_every_step_of_the_loop():
    used = [c[0] for c in doc_commands(DOC.read_text())]
    assert [u for u in used if u in ("check-env", "sft", "plan", "train")][:5] == [
        "check-env", "check-env", "sft", "plan", "train"]
    assert {"eval", "report", "inspect", "view"} <= set(used)


def test_the_page_warm_starts_with_one_plain_command():
    """One recipe: every `agentrl sft` of the page is `sft CONFIG --out DIR`, its defaults."""
    sfts = [c for c in doc_commands(DOC.read_text()) if c[0] == "sft"]
    assert len(sfts) == 2 and all(len(c) == 4 and c[2] == "--out" for c in sfts), sfts
    text = DOC.read_text()
    for word in ("demonstrate_summary", "needed_facts", "--compact-share", "--strategies",
                 "--base", '`tool`'):
        assert word in text, word


def test_the_pages_long_trace_environment_passes_check_env(tmp_path, monkeypatch, capsys):
    """Section 8's files and its check-env command, as the page writes them; then the same
    check with a budget a page turn cannot fit fails with the page's token counts."""
    text = DOC.read_text()
    for name, content in doc_files(text).items():
        (tmp_path / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    check = next(c for c in doc_commands(text) if c[0] == "check-env" and "notebook.toml" in c)
    assert main(check) == 0
    out = capsys.readouterr().out
    assert "reward 1" in out and "16 played, 16 correct" in out
    assert main([*check, "--set", "compaction.max_context_tokens=240"]) == 1
    errors = [line for line in capsys.readouterr().out.splitlines() if line.startswith("error")]
    assert errors == [line for line in text.splitlines() if line.startswith("error: env")]


@pytest.mark.slow
def test_the_walkthrough_reaches_a_training_step_with_compaction(tmp_path, monkeypatch,
                                                                 capsys):
    text = DOC.read_text()
    for name, content in doc_files(text).items():
        (tmp_path / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    commands = doc_commands(text)
    assert unknown_commands(commands) == []  # none skipped: a typo fails here
    for command in commands:
        argv = scaled(command)
        assert main(argv) == 0, f"`agentrl {shlex.join(argv)}` failed"
    out = capsys.readouterr().out
    # 3:1 of 160 demonstrations; the page's demonstrator guesses on 3 tasks of 4, and
    # only the guesses that were right are kept
    kept = int(re.search(r"logsearch: 120 played, (\d+) correct", out).group(1))
    assert 30 < kept < 120
    assert "reward 1" in out  # check-env's scripted episode
    steps = [m for m in read_metrics(tmp_path / "runs" / "logsearch") if m["step"] >= 1]
    assert steps and steps[0]["env/logsearch/num_rollouts"] == 24
    assert any(m["env/logsearch/num_compactions/mean"] > 0 for m in steps)
    assert (tmp_path / "runs" / "logsearch" / "curve.png").exists()
    notebook = [m for m in read_metrics(tmp_path / "runs" / "notebook") if m["step"] >= 1]
    assert notebook and notebook[0]["env/notebook/num_rollouts"] == 32


def test_the_pages_jsonl_example_is_a_correct_demonstration(tmp_path, monkeypatch):
    import asyncio

    from agentrl.config import load_config
    from agentrl.envs.demonstrations import demonstration_policies, load_trajectories
    from agentrl.model.tiny import tiny_tokenizer
    from agentrl.rollout.demonstrations import play_demonstrations

    text = DOC.read_text()
    example = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    (tmp_path / "demos.jsonl").write_text(example)
    monkeypatch.chdir(EXAMPLE)
    config = load_config("logsearch_mix.toml", ["model.path=''", "environments.1.weight=1e-6",
                                                "rollout.max_new_tokens=200",
                                                "compaction.strategy='none'"])
    trajectories = load_trajectories([tmp_path / "demos.jsonl"])
    policies = demonstration_policies(config, trajectories)
    lines: list[str] = []
    rollouts = asyncio.run(play_demonstrations(config, tiny_tokenizer(0), 2, seed=0,
                                               policies=policies, log=lines.append))
    assert "logsearch: 2 played, 2 correct" in lines[0]
    assert {r.stats.num_turns for r in rollouts if r.env == "logsearch"} == {3}


def test_the_pages_weaker_demonstrator_reads_on_its_share_of_tasks(monkeypatch):
    import sys

    from agentrl import Message

    monkeypatch.syspath_prepend(str(EXAMPLE))
    sys.modules.pop("logsearch", None)
    from logsearch import LogSearchEnv

    def reads(share: float, seed: int) -> bool:
        env = LogSearchEnv(demo_read_share=share)
        messages, _ = env.reset(seed=seed)
        action = env.demonstrate(messages)
        observation, *_ = env.step(action)
        return '"read"' in env.demonstrate([*messages, Message("assistant", action),
                                            *observation])

    seeds = range(200)
    assert all(reads(1.0, s) for s in seeds) and not any(reads(0.0, s) for s in seeds)
    quarter = [s for s in seeds if reads(0.25, s)]
    assert 30 <= len(quarter) <= 70  # about 1 task in 4, the same tasks every time
    assert quarter == [s for s in seeds if reads(0.25, s)]
    with pytest.raises(ValueError, match="demo_read_share is 1.5"):
        LogSearchEnv(demo_read_share=1.5)
