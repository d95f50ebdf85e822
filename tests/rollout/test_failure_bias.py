"""Infrastructure failures independent of the task leave the estimate unbiased.

A three-armed bandit with three tasks (each task pays the arms differently) is played by a
fixed softmax policy through the real runner (a scripted engine samples the arm with the
rollout's sampling seed). Environment constructors fail at random, independent of the
task, at 0 %, 10 % and 50 %. Over ``NUM_COLLECTIONS`` seeded collections, the mean
advantage of each arm and the mean policy gradient (token-level: sum over trained
rollouts of A * d log pi(a) / d logits, divided by the trained tokens) must equal the
failure-free ones within ``Z`` standard errors of the paired per-collection difference
(the same tasks and, for first attempts, the same sampling seeds at every rate).

Retrying is what makes it so: masking the same failures without retries (the rule before
retries existed) shrinks groups, and GRPO's group baseline then scales every advantage by
(1 - 1/n) for a group of n, so the gradient shrinks; the test checks that this difference
is detected, so the tolerance is tight enough to see a bias.
"""

from __future__ import annotations

import asyncio
import math
import random
import warnings

import numpy as np
import pytest

from agentrl.advantage import rollout_advantages
from agentrl.config import config_from_dict
from agentrl.reassembler import to_rows
from agentrl.rollout.episode import CURRENT_ROLLOUT
from agentrl.rollout.failures import RetriesExhaustedWarning
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Message
from tests.rollout.stand_ins import ScriptedEngine

ARMS = ("red", "green", "blue")
POLICY = np.array([0.5, 0.3, 0.2])
"""The policy's probability of each arm (softmax of its logits)."""
PAYS = np.array([[1.0, 0.5, 0.0], [1.2, 0.7, 0.2], [0.8, 0.3, -0.2]])
"""Reward of each arm (column) on each task (row: task seed % 3): red is best everywhere,
the tasks add different offsets (which the group baselines remove)."""
NUM_COLLECTIONS = 24
"""Collections per failure rate (8 groups of 4 rollouts each)."""
GROUPS, GROUP_SIZE = 8, 4
Z = 4.0
"""Tolerance in standard errors of the mean paired difference (a false alarm at 4 sigma:
about 6e-5 per figure)."""


class Bandit:
    """One pull: the arm named in the action pays ``PAYS[task, arm]``. The constructor
    fails (a server that refused the session) with probability ``rate``, decided by the
    rollout id alone: independent of the task."""

    def __init__(self, rate: float, broken_task: int | None = None) -> None:
        rollout_id = CURRENT_ROLLOUT.get().rollout_id
        if random.Random(f"fail:{rollout_id}").random() < rate:
            raise ConnectionError("env server refused the session")
        self.broken_task = broken_task
        self.task = 0

    def reset(self, *, seed=None, options=None):
        if seed == self.broken_task:
            raise ConnectionError(f"task {seed} crashes the env server")
        self.task = seed % 3
        return [Message("user", "Pick red, green or blue.")], {}

    def step(self, action: str):
        arm = next(i for i, name in enumerate(ARMS) if name in action)
        info = {"reward_components": {ARMS[arm]: 1.0}}  # which arm, for the gradient
        return [], float(PAYS[self.task, arm]), True, False, info


def pull(prompt, params) -> str:
    return random.Random(params.seed).choices(ARMS, weights=POLICY)[0]


def collections(tokenizer, rate: float, max_retries: int, num: int = NUM_COLLECTIONS,
                broken_task: int | None = None):
    config = config_from_dict({
        "environments": [{"id": "test:bandit", "name": "bandit"}],
        "batch": {"rollout_batch_size": GROUPS, "n_samples_per_prompt": GROUP_SIZE,
                  "global_batch_size": GROUPS * GROUP_SIZE},
        "rollout": {"max_turns": 1, "max_retries": max_retries},
    })
    runner = RolloutRunner(config, ScriptedEngine(tokenizer, pull), tokenizer,
                           EnvironmentSampler({"bandit": 1.0}, seed=0),
                           make_env=lambda c: Bandit(rate, broken_task))
    return [asyncio.run(runner.collect(step, GROUPS * GROUP_SIZE)) for step in range(num)]


def figures(collection) -> np.ndarray:
    """Per collection: the mean advantage of each arm's trained rollouts, then the
    token-level policy gradient with respect to the three logits."""
    rollouts = collection.rollouts
    advantages = rollout_advantages(to_rows(rollouts))
    gradient, per_arm = np.zeros(3), [[] for _ in ARMS]
    tokens = sum(r.num_generated_tokens for r in rollouts if r.trainable)
    for rollout in rollouts:
        if not rollout.trainable:
            continue
        arm = _arm(rollout)
        advantage = advantages[rollout.rollout_id].advantage
        per_arm[arm].append(advantage)
        # every generated token carries the advantage; only the arm's choice has a
        # gradient with respect to the logits: (onehot(arm) - pi)
        gradient += advantage * (np.eye(3)[arm] - POLICY) / tokens
    return np.array([np.mean(a) if a else 0.0 for a in per_arm] + list(gradient))


def _arm(rollout) -> int:
    return ARMS.index(next(iter(rollout.reward_components)))


def paired_gap(failing: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """|mean difference| in standard errors of the mean, per figure."""
    diff = failing - clean
    se = diff.std(axis=0, ddof=1) / math.sqrt(len(diff))
    return np.abs(diff.mean(axis=0)) / np.maximum(se, 1e-12)


@pytest.fixture(scope="module")
def clean(tokenizer):
    return np.array([figures(c) for c in collections(tokenizer, 0.0, 8)])


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_random_infrastructure_failures_leave_advantages_and_gradient_unbiased(
        tokenizer, clean, rate):
    results = collections(tokenizer, rate, max_retries=8)
    assert sum(sum(k.values()) for c in results for k in c.retried.values()) > 0
    failing = np.array([figures(c) for c in results])
    gap = paired_gap(failing, clean)
    assert (gap < Z).all(), (rate, gap)
    assert np.allclose(failing.mean(axis=0), clean.mean(axis=0), atol=0.05)


def test_masking_without_retries_is_biased_and_detected(tokenizer, clean):
    results = collections(tokenizer, 0.5, max_retries=0)
    failing = np.array([figures(c) for c in results])
    gradient_norm = np.linalg.norm(failing[:, 3:].mean(axis=0))
    clean_norm = np.linalg.norm(clean[:, 3:].mean(axis=0))
    assert gradient_norm < 0.85 * clean_norm  # smaller groups, smaller advantages
    assert (paired_gap(failing, clean)[3:] > Z).any()


def test_a_task_that_always_breaks_the_server_is_named_not_learned(tokenizer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = collections(tokenizer, 0.0, max_retries=2, num=1, broken_task=None)
        broken = results[0].groups[0].task_seed
        results = collections(tokenizer, 0.0, max_retries=2, num=1, broken_task=broken)
    named = [str(w.message) for w in caught if issubclass(w.category, RetriesExhaustedWarning)]
    assert len(named) == 1  # once per task, its other rollouts only counted
    assert f"env 'bandit', task seed {broken}: all 3 attempts" in named[0]
    group = next(g for g in results[0].groups if g.task_seed == broken)
    # masked: no zero reward enters a baseline, so nothing teaches the policy to avoid it
    assert not any(r.trainable for r in group.rollouts)
    assert results[0].invalid == {"bandit": {"reset_raised": GROUP_SIZE}}
