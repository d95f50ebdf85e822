"""One short real training run shared by the transcript tests (built once per session).

Two environments: ``LongToolEnv`` answers every reply with a bulky tool result for three
turns, so contexts pass a small budget and drop_oldest compaction fires; its tool results
carry markup (``<script>``, ``[bold]``) that every renderer must show as text. The second
is the single-turn ``ShortAnswerEnv`` of the end-to-end tests. Validation runs at steps 0
and 2, so the metrics hold both training and validation figures; a price table
(``log.costs``) makes the run log its cost.
"""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.envs import AgentEnv, Task
from agentrl.model import build_tiny_checkpoint
from agentrl.types import Message

PAYLOAD = "<script>document.title='pwned'</script><img src=x onerror=\"document.body" \
          ".setAttribute('data-pwned','1')\"> [bold red]not markup[/bold red]"
"""Hostile text in every tool result: must reach the reader as text, never run."""

CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2
n_samples_per_prompt = 4
global_batch_size = 8
[rollout]
max_new_tokens = 6
max_turns = 4
[compaction]
strategy = "drop_oldest"
max_context_tokens = 400
keep_last_turns = 1
[train]
num_steps = 2
eval_every = 2
eval_tasks_per_env = 1
seed = 5
[log]
live = false
rollouts_random_per_env = 1
[log.costs]
per_generation_second = 0.01
per_env_second = 0.001
per_million_generated_tokens = 2.0
per_million_prompt_tokens = 0.5
[[environments]]
id = "tests.transcripts.conftest:LongToolEnv"
name = "longtool"
[[environments]]
id = "tests.train.test_train_e2e:ShortAnswerEnv"
name = "short"
"""


class LongToolEnv(AgentEnv):
    """Four turns, the first three answered by a bulky ``lookup`` tool result; reward: the parity of
    the last reply's length, so a group's rewards differ."""

    max_turns = 4

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A task with a number, so tasks differ by seed."""
        number = int(rng.integers(1000))
        return Task([Message("system", "Read the reports."),
                     Message("user", f"Task {number}: read three reports.")], key=str(number))

    def grade(self, answer: str) -> float:
        """Unused: ``step`` ends the episode itself."""
        return 0.0

    def step(self, action: str):
        """A tool result for the first three turns; the fourth ends the episode."""
        self._turn += 1
        if self._turn >= self.max_turns:
            self._done = True
            return [], float(len(action) % 2), True, False, {"tool_errors": {}}
        report = f"report {self._turn}: {PAYLOAD} " + "data " * 4
        return ([Message("tool", report, "lookup")], 0.0, False, False,
                {"tool_errors": {"tool_exception": 1} if self._turn == 1 else {}})


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


@pytest.fixture(scope="session")
def sampled_run(tmp_path_factory, tiny_model):
    """A run folder of two training steps with rollout samples, metrics and validation."""
    folder = tmp_path_factory.mktemp("sampled")
    config = folder / "run.toml"
    config.write_text(CONFIG.format(model=tiny_model))
    out = folder / "run"
    assert main(["train", str(config), "--out", str(out)]) == 0
    return out
