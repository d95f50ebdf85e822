"""Cost per step and per environment: seconds and tokens, and their price.

Every rollout carries what playing it used (:class:`agentrl.types.Spend`: its share of the
engine's busy seconds, its environment and sandbox seconds, its generated and prompt
tokens). The runner adds them up per environment over every rollout it played for the
step, groups that dynamic sampling dropped included: they were paid for too
(:class:`PlayedCosts`). :func:`cost_figures` turns that into metrics::

    cost/generation_seconds, cost/env_seconds, cost/sandbox_seconds,
    cost/generated_tokens, cost/prompt_tokens           (and env/<name>/cost/... each)

and, with a price table (``log.costs``), ``cost/step`` and ``env/<name>/cost/step`` (the
step's cost), ``cumulative/cost`` (the run's, across resumes), and
``cost/per_reward_point`` and ``env/<name>/cost/per_reward_point`` (cost over the summed
reward of the same rollouts; left out of a step whose reward sum is not above 0, where
the ratio means nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.config import CostsConfig
from agentrl.types import Rollout, Spend

QUANTITIES = (
    ("generation_seconds", "generation_s", "per_generation_second", 1.0),
    ("env_seconds", "env_s", "per_env_second", 1.0),
    ("sandbox_seconds", "sandbox_s", "per_sandbox_second", 1.0),
    ("generated_tokens", "num_generated_tokens", "per_million_generated_tokens", 1e-6),
    ("prompt_tokens", "num_prompt_tokens", "per_million_prompt_tokens", 1e-6),
)
"""(metric name, Spend field, price field, price unit per item)."""


class PlayedCosts(Spend):
    """One environment's rollouts of a collection, summed: what they used and earned."""

    num_rollouts: int = 0
    reward_sum: float = 0.0
    """Their rewards summed (every rollout once, valid or not)."""

    def count(self, rollout: Rollout) -> None:
        """Add one played rollout."""
        self.add(rollout.stats.spend)
        self.num_rollouts += 1
        self.reward_sum += rollout.reward

    def merge(self, other: PlayedCosts) -> None:
        """Add another environment's sums (for the step's totals)."""
        self.add(other)
        self.num_rollouts += other.num_rollouts
        self.reward_sum += other.reward_sum


def price(spend: Spend, prices: CostsConfig) -> float:
    """What ``spend`` costs under the price table (sandbox seconds are priced on top of
    the environment seconds they are part of)."""
    return sum(getattr(spend, field) * getattr(prices, rate) * unit
               for _, field, rate, unit in QUANTITIES)


def cost_figures(played: Mapping[str, PlayedCosts], prices: CostsConfig | None,
                 cumulative_cost: float = 0.0) -> dict[str, Any]:
    """The step's seconds, tokens and (with ``prices``) costs, overall and per environment
    (module doc); ``cumulative_cost``: the run's cost before this step."""
    total = PlayedCosts()
    out: dict[str, Any] = {}
    for name, costs in sorted(played.items()):
        total.merge(costs)
        out.update(_figures(costs, prices, f"env/{name}/"))
    out.update(_figures(total, prices, ""))
    if prices is not None:
        out["cumulative/cost"] = cumulative_cost + out["cost/step"]
    return out


def _figures(costs: PlayedCosts, prices: CostsConfig | None, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}cost/{name}": getattr(costs, field)
                           for name, field, _, _ in QUANTITIES}
    if prices is None:
        return out
    step = price(costs, prices)
    out[f"{prefix}cost/step"] = step
    if costs.reward_sum > 0:
        out[f"{prefix}cost/per_reward_point"] = step / costs.reward_sum
    return out


def length_figures(trained: list[Rollout], played: Mapping[str, PlayedCosts]) -> dict[str, float]:
    """Generated tokens per rollout: ``length/trained_mean`` over the rollouts the step
    trains (trainable rollouts of the kept groups), ``length/generated_mean`` over every
    rollout the collection generated (dropped groups and retried attempts included),
    overall and as ``env/<name>/length/...``. Trained below generated means long rollouts
    are lost on the way (failures, dynamic sampling): the estimate leans toward short
    ones, the hard tasks lose their share."""
    out: dict[str, float] = {}
    envs = sorted(set(played) | {r.env for r in trained})
    for prefix, names in [("", envs), *((f"env/{env}/", [env]) for env in envs)]:
        mine = [r.stats.spend.num_generated_tokens for r in trained
                if r.trainable and r.env in names]
        if mine:
            out[f"{prefix}length/trained_mean"] = sum(mine) / len(mine)
        num = sum(played[n].num_rollouts for n in names if n in played)
        if num:
            tokens = sum(played[n].num_generated_tokens for n in names if n in played)
            out[f"{prefix}length/generated_mean"] = tokens / num
    return out
