"""The derived waits, worked out by hand from a small config."""

from __future__ import annotations

from agentrl.config import config_from_dict
from agentrl.parallel.timeouts import timeouts


def config(**train):
    return config_from_dict({
        "environments": [{"id": "agentrl/Countdown-v0"}, {"id": "agentrl/Calculator-v0"}],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "global_batch_size": 8},
        "rollout": {"max_concurrent_rollouts": 3, "rollout_timeout_s": 100,
                    "filter_uniform_groups": True, "max_extra_collections": 2},
        "train": {"eval_every": 5, "eval_tasks_per_env": 4, **train}})


def test_the_waits_cover_rank0s_collection_validation_and_checkpoint():
    # collection: 3 rounds × ceil(8 rollouts / 3 at once) = 3 waves × 100 s = 900 s;
    # validation: ceil(2 envs × 4 tasks / 3) = 3 waves × 100 s = 300 s; checkpoint 1800 s
    derived = timeouts(config())
    assert (derived.collective_s, derived.wait_for_rank0_s) == (3000.0, 3000.0)
    without_eval = timeouts(config(eval_every=0))  # 900 + 1800, the collective floor 1800
    assert (without_eval.collective_s, without_eval.wait_for_rank0_s) == (2700.0, 2700.0)
    given = timeouts(config(collective_timeout_s=60, wait_for_rank0_timeout_s=7200))
    assert (given.collective_s, given.wait_for_rank0_s) == (60, 7200)


def _lost_rank0_worker(rank: int) -> None:
    import time

    import pytest
    import torch.distributed as dist

    from agentrl.parallel import groups

    if rank == 1:  # rank 0 never finishes 'collection/1': the wait ends, naming the knob
        start = time.monotonic()
        with pytest.raises(groups.MainRankTimeout, match=r"rank 1 waited 1s for rank 0 to "
                           r"finish 'collection/1'; raise train.wait_for_rank0_timeout_s"):
            groups.wait_for_main("collection/1", 1.0)
        assert time.monotonic() - start < 30
    dist.barrier()  # rank 0 keeps the store alive until rank 1 has seen the timeout


def test_a_rank_waiting_for_a_lost_rank0_stops_with_the_setting_named():
    from tests.parallel.ranks import spawn_ranks

    spawn_ranks(2, _lost_rank0_worker)
