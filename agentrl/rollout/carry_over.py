"""Carry-over: a collection is due when it holds its quota of complete groups.

With ``rollout.max_staleness = k >= 1`` and ``rollout.carry_over`` the asynchronous
collector (``agentrl.rollout.async_collector``) does not wait for a collection's slowest
group before the next one starts. The sampler still draws each collection's tasks as
one *draw* (the same per-environment allocation, the same group ids ``s<draw>-g<i>``),
but draw ``c + 1`` is made as soon as the engine's weights are recent enough for it, and
its groups start in the places draw ``c``'s finished groups leave while its slow ones
still run. Collection ``s`` is then due once, for every
environment, it can take its *quota* (the number of groups draw ``s`` gave that
environment) from the complete groups of draws ``s`` and ``s + 1``; a group still
running carries over to the next collection, where it counts towards that
collection's quota. A GRPO group is taken only whole (all its rollouts done).

**The bound.** A group started under weights of version ``v`` holds no token older than
``v`` (in-flight updates only make later tokens newer), so it may be trained by step
``v + 1 + k`` at the latest: its *deadline*. A running group whose deadline is ``s``
cannot carry over; collection ``s`` waits for it. Nothing is ever discarded.

**Refill.** At most one draw's worth of groups runs at once (as many as without
carry-over): a drawn group starts when a running one ends, oldest draw first. So the
next draw's groups take the places the finished groups of a slow collection leave,
rather than sharing the engine with all of them (which would delay the collection the
trainer waits for), and a group that starts after newer weights arrived gets a later
deadline and may carry over.

**Why it always fits.** Draw ``c`` starts only under weights ``v >= c - 1 - k`` (so its
deadline is ``>= c``), and only while collection ``c - 1`` is the oldest not yet formed
(two draws in play). Then every group trained so far came from a draw ``<= s``, so the
untrained groups of draws ``<= s`` of an environment are exactly its quota in ``s``: the
groups collection ``s`` must wait for never outnumber what it may take, and what it
leaves is exactly collection ``s + 1``'s quota.

**Checkpoints.** :meth:`CarryPool.resume_point` names the first draw that still has a
group not trained before a step, and the groups of that draw and later ones already
trained. A resumed run restores the sampler to before that draw, draws again (same
tasks, same group ids), skips the groups already trained and regenerates the rest, so
no carried-over group is lost or trained twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentrl.types import Group


@dataclass
class Pending:
    """One group of a draw: running (``group`` None) or complete, not yet or already
    handed to a collection."""

    group_id: str
    env: str
    draw: int
    """The collection the sampler drew its task for."""
    index: int
    """Its place in the draw (``s<draw>-g<index>``)."""
    task_seed: int
    deadline: int
    """The last step that may train it: its start version + 1 + max_staleness (until it
    starts, from the version its draw was made under: a lower bound)."""
    group: Group | None = None
    collection: int | None = None
    """The step whose collection took it."""


class CarryPool:
    """The groups of the draws in play and which collection takes each (module doc).
    Pure bookkeeping: the collector starts the groups and reports them complete."""

    def __init__(self, max_staleness: int, trained: set[str] | None = None) -> None:
        """``trained``: group ids a checkpoint says were trained already (skipped)."""
        self.max_staleness = max_staleness
        self.trained = set(trained or ())
        self.groups: dict[str, Pending] = {}
        self.quotas: dict[int, Counter[str]] = {}
        """Per draw, its groups per environment: the quota of the collection of the
        same number."""

    def add_draw(self, draw: int, tasks: list[tuple[str, Any]], version: int) -> list[Pending]:
        """Record draw ``draw``'s tasks ((group id, TaskDraw) each), made under weights
        of ``version``; returns the groups to start (those not trained already)."""
        deadline = version + 1 + self.max_staleness
        if deadline < draw:
            raise ValueError(f"draw {draw} cannot start under weights of version {version}: "
                             f"older than rollout.max_staleness = {self.max_staleness}")
        self.quotas[draw] = Counter(task.env for _, task in tasks)
        started = []
        for index, (group_id, task) in enumerate(tasks):
            if group_id in self.trained:
                continue
            pending = Pending(group_id, task.env, draw, index, task.seed, deadline)
            self.groups[group_id] = pending
            started.append(pending)
        return started

    def started(self, pending: Pending, version: int) -> None:
        """``pending`` starts now, under weights of ``version`` (>= its draw's)."""
        pending.deadline = max(pending.deadline, version + 1 + self.max_staleness)

    def complete(self, group: Group) -> None:
        """A started group finished (all its rollouts)."""
        self.groups[group.group_id].group = group

    def take(self, step: int) -> list[Group] | None:
        """Collection ``step``'s groups when it is due, else None: per environment its
        quota, first every group whose deadline is ``step`` (waited for), then complete
        groups by deadline and draw. Marks them taken."""
        if step not in self.quotas:
            return None
        waiting = [p for p in self.groups.values() if p.collection is None]
        chosen: list[Pending] = []
        for env in sorted({p.env for p in waiting} | set(self.quotas[step])):
            quota = self.quotas[step][env]
            mine = [p for p in waiting if p.env == env]
            must = [p for p in mine if p.deadline <= step]
            if len(must) > quota:
                raise RuntimeError(f"collection {step} must train {len(must)} groups of env "
                                   f"{env!r} to keep the staleness bound but its quota is "
                                   f"{quota}: a bug in the carry-over schedule")
            if any(p.group is None for p in must):
                return None
            done = sorted((p for p in mine if p.group is not None and p.deadline > step),
                          key=lambda p: (p.deadline, p.draw, p.index))
            if len(must) + len(done) < quota:
                return None
            chosen += must + done[:quota - len(must)]
        for pending in chosen:
            pending.collection = step
        chosen.sort(key=lambda p: (p.draw, p.index))
        return [p.group for p in chosen if p.group is not None]

    def resume_point(self, step: int, next_draw: int) -> tuple[int, list[str]]:
        """For a checkpoint taken before training ``step``: the first draw with a group
        not trained by an earlier step (``next_draw`` when every drawn group was), and
        the ids of the groups of that draw and later ones that earlier steps trained."""
        open_draws = [p.draw for p in self.groups.values()
                      if p.collection is None or p.collection >= step]
        first = min(open_draws, default=next_draw)
        trained = sorted(
            [p.group_id for p in self.groups.values()
             if p.draw >= first and p.collection is not None and p.collection < step]
            + [gid for gid in self.trained if draw_of(gid) >= first])
        return first, trained

    def forget_before(self, draw: int) -> None:
        """Drop the bookkeeping of draws before ``draw`` (all their groups trained)."""
        self.groups = {gid: p for gid, p in self.groups.items() if p.draw >= draw}
        self.quotas = {d: q for d, q in self.quotas.items() if d >= draw - 1}
        self.trained = {gid for gid in self.trained if draw_of(gid) >= draw}


def check_resumable(resume: dict[str, Any] | None, first_step: int, carrying: bool) -> None:
    """Refuse to resume a checkpoint holding carried-over groups (``resume``: its
    sampler state's ``"carry_over"`` entry) without carry-over: they would be lost."""
    if resume is not None and resume["draw"] < first_step and not carrying:
        raise ValueError(f"the checkpoint holds groups drawn for collection {resume['draw']} "
                         "that were carried over and not trained yet; resume it with "
                         "rollout.max_staleness >= 1 and rollout.carry_over = true")


def draw_of(group_id: str) -> int:
    """The draw number in a group id ``s<draw>-g<index>``."""
    return int(group_id.split("-")[0].removeprefix("s"))
