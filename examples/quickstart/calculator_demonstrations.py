"""Calculator demonstrations from a demonstrator who uses the tool only some of the time.

The quickstart's warm start learns from them (``agentrl sft --demonstrations``): in
``--tool-share`` of the episodes the demonstrator calls ``calculate`` and answers with its
result, in the others it answers at once, from mental arithmetic. Both kinds are correct,
so the warm start copies both habits; a tiny model cannot do the arithmetic in its head,
and RL has something to learn: that the tool pays. The same trajectories warm-start the
harness example (``--env calc_agent``, docs/harnesses.md): there they are the replies to
the program's requests, and its own ``calculate`` tool answers the calls.

    python examples/quickstart/calculator_demonstrations.py --out demos.jsonl \
        --num 600 --tool-share 0.5 --kwargs '{"num_operations": 1, "max_number": 9}'
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from agentrl.envs.registry import make


def trajectories(num: int, tool_share: float, kwargs: dict, seed: int = 0,
                 env_name: str = "calculator") -> list[dict]:
    """``num`` correct trajectories of Calculator tasks (seeds 0, 1, ...): the tool-using
    script's actions in ``tool_share`` of them, a direct answer in the rest; ``env_name``
    is the environment's name in the config that trains on them."""
    if not 0.0 <= tool_share <= 1.0:
        raise ValueError(f"--tool-share is {tool_share}; it must be in [0, 1]")
    env = make("agentrl/Calculator-v0", **kwargs)
    rng = np.random.default_rng(seed)
    lines = []
    for task_seed in range(num):
        messages, _ = env.reset(seed=task_seed)
        if rng.random() < tool_share:
            call = env.demonstrate(messages)
            observation, *_ = env.step(call)
            actions = [call, env.demonstrate(messages + observation)]
        else:
            actions = [str(env.task.answer)]
        lines.append({"env": env_name, "seed": task_seed, "actions": actions})
    env.close()
    return lines


def main(argv: list[str] | None = None) -> None:
    """Write the trajectories as JSONL."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--num", type=int, default=600)
    parser.add_argument("--tool-share", type=float, default=0.5)
    parser.add_argument("--kwargs", default="{}", help="Calculator-v0 kwargs as JSON")
    parser.add_argument("--env", default="calculator",
                        help="the environment's name in the config (each line's \"env\"); "
                             "calc_agent for examples/harness/calc_agent.toml")
    args = parser.parse_args(argv)
    with open(args.out, "w") as out:
        for line in trajectories(args.num, args.tool_share, json.loads(args.kwargs),
                                 env_name=args.env):
            out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
