"""Hard (slow) tasks keep their share of training under asynchronous collection.

    python -m bench.long_tail [--steps N] [--groups G] [--ks 0,1,2] [--slow 5]
                              [--carry-over both|on|off]

A mix of two environments through the real runner and the real asynchronous collector
(``agentrl.rollout.async_collector``): ``quick`` (every tool call takes ``step_s``) and
``longtail``, whose hard tasks (one task seed in four) take ``--slow`` times longer (5x
by default: twice the tool calls, each 2.5x slower, so twice the generated tokens). The
engine is a stand-in that sleeps per generation (the schedule, not the model, is what is
measured) and the trainer a stand-in that sleeps ``train_s`` per step and publishes the
next weight version. For each k (0: collect, then
train; k >= 1: generation runs up to k versions ahead, with ``rollout.carry_over`` on
and off: ``--carry-over both``) it prints, over every step:

- the hard tasks' share of the tasks the sampler drew, and their share of the rollouts
  handed to the trainer (equal when no rollout is left behind: a group still running
  when its collection is due carries over to the next one or is waited for,
  ``agentrl.rollout.carry_over``; without carry-over a collection waits for its slowest
  rollout; dropping the groups still running, or past a staleness bound, would lose
  exactly the hard ones);
- the groups trained in a later collection than the one they were drawn for (carried
  over), and how many of them were hard;
- the generated tokens per rollout of the rollouts trained against every rollout
  generated, per environment (``length/trained_mean`` / ``length/generated_mean``);
- the oldest token trained (at most k) and steps per second.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch

from agentrl.config import config_from_dict
from agentrl.engines.interface import Generation, SamplingParams
from agentrl.model.tiny import tiny_tokenizer
from agentrl.observe.costs import PlayedCosts, length_figures
from agentrl.rollout.async_collector import AsyncCollector
from agentrl.rollout.carry_over import draw_of
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.staleness import engine_version, oldest_version
from agentrl.types import Message

HARD_EVERY = 4
"""One task seed in this many is hard (``seed % HARD_EVERY == 0``)."""


class SleepyEngine:
    """Generates a short reply after ``seconds``, stamped with its weight version."""

    def __init__(self, tokenizer: Any, seconds: float) -> None:
        self.tokenizer, self.seconds = tokenizer, seconds
        self.weight_version = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        await asyncio.sleep(self.seconds)
        ids = self.tokenizer.encode("look")[: params.max_tokens]
        return Generation(ids + [self.tokenizer.eos_token_id], [-0.5] * (len(ids) + 1), "stop")

    def update_weights(self, named_tensors: Any, version: int | None = None, *,
                       in_flight: bool = False) -> None:
        self.weight_version = int(version or 0)


class TurnsEnv:
    """Three tool calls, then the end; each call sleeps ``step_s``. A hard task of a
    long-tail environment (``slow`` > 1) takes ``slow`` times as long: twice the calls,
    each ``slow / 2`` times slower. Reward: the task seed's parity."""

    def __init__(self, step_s: float, slow: float) -> None:
        self.step_s, self.slow = step_s, slow
        self.seed, self.turn = 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.seed, self.turn = int(seed or 0), 0
        return [Message("user", f"Task {seed}: look three times.")], {}

    async def astep(self, action: str):
        hard = self.slow > 1 and self.seed % HARD_EVERY == 0
        await asyncio.sleep(self.step_s * (self.slow / 2 if hard else 1.0))
        self.turn += 1
        if self.turn >= (6 if hard else 3):
            return [], float(self.seed % 2), True, False, {}
        return [Message("tool", "nothing yet", name="look")], 0.0, False, False, {}

    def step(self, action: str):
        raise RuntimeError("astep only")


def make_env(env_config: Any, step_s: float, slow: float) -> TurnsEnv:
    return TurnsEnv(step_s, slow if env_config.name == "longtail" else 1.0)


def config(groups: int, k: int) -> Any:
    return config_from_dict({
        "environments": [{"id": "bench:quick", "name": "quick", "weight": 1.0},
                         {"id": "bench:longtail", "name": "longtail", "weight": 1.0}],
        "batch": {"rollout_batch_size": groups, "n_samples_per_prompt": 4,
                  "global_batch_size": groups * 4},
        "rollout": {"max_turns": 8, "max_new_tokens": 8, "max_staleness": k},
    })


class CountingSampler(EnvironmentSampler):
    """The sampler, counting the hard tasks among every task it draws."""

    drawn = (0, 0)  # hard, all

    def sample_tasks(self, num_groups: int) -> list[Any]:
        """Draw as usual; count."""
        return self._count(super().sample_tasks(num_groups))

    def tasks_of(self, env: str, num_groups: int) -> list[Any]:
        """Draw as usual; count."""
        return self._count(super().tasks_of(env, num_groups))

    def _count(self, draws: list[Any]) -> list[Any]:
        hard = sum(d.env == "longtail" and d.seed % HARD_EVERY == 0 for d in draws)
        self.drawn = (self.drawn[0] + hard, self.drawn[1] + len(draws))
        return draws


class Tally:
    """Sampled tasks, trained rollouts and lengths over a run."""

    def __init__(self) -> None:
        self.trained = [0, 0]  # hard, all (rollouts handed to the trainer)
        self.carried = [0, 0]  # hard, all (groups trained after the step drawn for)
        self.oldest_age = 0
        self.played: dict[str, PlayedCosts] = {}
        self.rollouts: list[Any] = []

    def add(self, step: int, collection: Any) -> None:
        for group in collection.groups:
            hard = int(group.env == "longtail" and group.task_seed % HARD_EVERY == 0)
            self.trained[0] += hard * len(group.rollouts)
            self.trained[1] += len(group.rollouts)
            if draw_of(group.group_id) < step:
                self.carried[0] += hard
                self.carried[1] += 1
            for rollout in group.rollouts:
                version = oldest_version(rollout)
                if version is not None:
                    self.oldest_age = max(self.oldest_age, step - 1 - version)
        self.rollouts += collection.rollouts
        for env, costs in collection.costs.items():
            self.played.setdefault(env, PlayedCosts()).merge(costs)


def run(k: int, steps: int, groups: int, step_s: float, slow: float, gen_s: float,
        train_s: float, carry_over: bool = False) -> tuple[Tally, float, tuple[int, int]]:
    """``steps`` steps at staleness ``k`` (with carry-over and in-flight weight updates
    when ``carry_over``): the tally, the wall seconds and the tasks drawn for the trained
    steps (hard, all; collections drawn ahead and never trained left out)."""
    cfg = config(groups, k)
    tokenizer = tiny_tokenizer(0)
    engine = SleepyEngine(tokenizer, gen_s)
    sampler = CountingSampler({"quick": 1.0, "longtail": 1.0}, seed=0)
    runner = RolloutRunner(cfg, engine, tokenizer, sampler,
                           make_env=lambda c: make_env(c, step_s, slow))
    tally, start = Tally(), time.perf_counter()
    num_rollouts = groups * 4
    if k == 0:
        for step in range(1, steps + 1):
            tally.add(step, asyncio.run(runner.collect(step, num_rollouts)))
            time.sleep(train_s)
            engine.update_weights({}, step)
        return tally, time.perf_counter() - start, sampler.drawn
    collector = AsyncCollector(runner, sampler, num_rollouts, k, 1, steps,
                               inflight_updates=carry_over, carry_over=carry_over)
    try:
        for step in range(1, steps + 1):
            tally.add(step, collector.next_collection(step))
            time.sleep(train_s)
            collector.publish({"w": torch.zeros(1)}, version=step)
        drawn = sampler.drawn  # the last collection is the run's last: nothing drawn ahead
    finally:
        collector.close()
    assert engine_version(engine) <= steps
    return tally, time.perf_counter() - start, drawn


def main() -> None:
    """Run each k and print the shares, lengths, staleness and speed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--slow", type=float, default=5.0)
    parser.add_argument("--step-s", type=float, default=0.02)
    parser.add_argument("--gen-s", type=float, default=0.01)
    parser.add_argument("--train-s", type=float, default=0.3)
    parser.add_argument("--carry-over", choices=("both", "on", "off"), default="both",
                        help="k >= 1 with rollout.carry_over on, off, or both in turn")
    args = parser.parse_args()
    print(f"{args.steps} steps of {args.groups} groups x 4 rollouts, environments quick and "
          f"longtail (1 in {HARD_EVERY} longtail tasks {args.slow:g}x slower)")
    print("k | carry-over | hard share: sampled tasks, trained rollouts | carried groups "
          "(hard/all) | tokens per rollout trained/generated (quick, longtail) | oldest "
          "token trained | steps/s")
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.carry_over]
    for k in (int(x) for x in args.ks.split(",")):
        for carry in modes if k else (False,):
            tally, seconds, drawn = run(k, args.steps, args.groups, args.step_s, args.slow,
                                        args.gen_s, args.train_s, carry)
            lengths = length_figures(tally.rollouts, tally.played)
            per_env = ", ".join(
                f"{lengths.get(f'env/{e}/length/trained_mean', 0):.1f}/"
                f"{lengths.get(f'env/{e}/length/generated_mean', 0):.1f}"
                for e in ("quick", "longtail"))
            print(f"{k} | {'on' if carry else 'off'} | {drawn[0] / drawn[1]:.3f}, "
                  f"{tally.trained[0] / tally.trained[1]:.3f} | {tally.carried[0]}/"
                  f"{tally.carried[1]} | {per_env} | {tally.oldest_age} | "
                  f"{args.steps / seconds:.2f}")


if __name__ == "__main__":
    main()
