"""``agentrl check-env ID_OR_MODULE:CLASS``: Gymnasium's checker plus scripted rollouts.

Prints the tools offered (schemas), then for each episode the transcript and the reward.
Actions come from ``--actions FILE`` (a JSON list of strings, or plain text with actions
separated by lines holding only ``---``), else the environment's ``scripted_action``
policy when it has one, else random text from the action space.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

HELP = "Check an environment: Gymnasium's env checker, tool schemas, scripted rollouts."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the environment, episodes, actions file, seed, constructor kwargs."""
    parser.add_argument("env", help="registered id (agentrl/Countdown-v0) or module:Class")
    parser.add_argument("--episodes", type=int, default=1, help="scripted rollouts to run")
    parser.add_argument("--actions", help="file of actions: JSON list, or text split by ---")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument("--kwargs", default="{}", help="constructor kwargs as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the checks; exit status 1 when Gymnasium's checker fails."""
    from gymnasium.utils.env_checker import check_env

    from agentrl.registry import make

    kwargs = _json_kwargs(args.kwargs)
    try:
        env = make(args.env, **kwargs)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env, skip_render_check=True)
    except (AssertionError, Exception) as exc:  # report any checker failure, do not crash
        print(f"gymnasium check_env: FAILED: {type(exc).__name__}: {exc}")
        return 1
    print("gymnasium check_env: passed")
    print("tools offered:")
    schemas = env.tool_schemas()
    print(json.dumps(schemas, indent=2) if schemas else "  (none)")
    actions = _load_actions(args.actions) if args.actions else None
    for episode in range(args.episodes):
        reward = _episode(env, args.seed + episode, actions)
        print(f"episode {episode} (seed {args.seed + episode}): reward {reward:g}")
    env.close()
    return 0


def _episode(env, seed: int, actions: list[str] | None) -> float:
    messages, _ = env.reset(seed=seed)
    transcript = list(messages)
    _print_messages(messages)
    total, step = 0.0, 0
    while True:
        action = _next_action(env, transcript, actions, step)
        print(f"[assistant] {action}")
        observation, reward, terminated, truncated, info = env.step(action)
        transcript += observation
        _print_messages(observation)
        total += reward
        step += 1
        if info.get("tool_errors"):
            print(f"  tool errors: {info['tool_errors']}")
        if terminated or truncated:
            components = info.get("reward_components") or {}
            end = "terminated" if terminated else "truncated"
            print(f"  {end}; reward {total:g} components {components}")
            return total


def _next_action(env, transcript: list, actions: list[str] | None, step: int) -> str:
    if actions is not None:
        return actions[step] if step < len(actions) else actions[-1]
    if hasattr(env, "scripted_action"):
        return env.scripted_action(transcript)
    return env.action_space.sample()


def _print_messages(messages: list) -> None:
    for message in messages:
        name = f":{message.name}" if message.name else ""
        content = message.content if len(message.content) < 600 else message.content[:600] + "…"
        print(f"[{message.role}{name}] {content}")


def _load_actions(path: str) -> list[str]:
    from agentrl.config import ConfigError

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--actions {path}: cannot read it ({exc})") from None
    if text.lstrip().startswith("["):
        actions = json.loads(text)
        if not all(isinstance(a, str) for a in actions):
            raise ConfigError(f"--actions {path}: a JSON file must hold a list of strings")
    else:
        actions = [a.strip("\n") for a in text.split("\n---\n")]
    if not actions:
        raise ConfigError(f"--actions {path} holds no actions")
    return actions


def _json_kwargs(text: str) -> dict:
    from agentrl.config import ConfigError

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--kwargs is not JSON ({exc}); e.g. '{{\"num_numbers\": 2}}'") from None
    if not isinstance(value, dict):
        raise ConfigError("--kwargs must be a JSON object")
    return value
