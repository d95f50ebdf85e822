"""``agentrl check-env ID_OR_MODULE:CLASS``: Gymnasium's checker plus scripted rollouts.

Prints the tools offered (schemas), the context budget (the first prompt's tokens: system
prompt, tool schemas, first observation, measured with the chat template and tokenizer of
``--config``'s model, else the tiny built-in one, against ``compaction.max_context_tokens``),
then for each episode the transcript and the reward. Actions come from ``--actions FILE``
(a JSON list of strings, or plain text with actions separated by lines holding only
``---``), else the environment's ``demonstrate`` policy when it has one, else random text
from the action space. Exit status 1 when the checker fails or the first prompt does not
fit the budget.
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
    parser.add_argument("--config", default=None,
                        help="a TOML config whose model tokenizer, compaction and rollout "
                             "settings the context budget is measured against (default: the "
                             "tiny built-in tokenizer and default settings)")


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
    if not _print_context_budget(args, kwargs):
        return 1
    actions = _load_actions(args.actions) if args.actions else None
    print(_policy_line(env, actions))
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


def _print_context_budget(args: argparse.Namespace, kwargs: dict) -> bool:
    """Print the first prompt's tokens against the budget; False when it does not fit."""
    import msgspec

    from agentrl.config import EnvironmentConfig, config_from_dict, load_config
    from agentrl.context_budget import (
        budget_problem,
        describe_budgets,
        measure_environments,
        plan_tokenizer,
    )

    if args.config:
        config = load_config(args.config)
    else:
        config = config_from_dict({"environments": [{"id": args.env, "kwargs": kwargs}]})
    env_config = EnvironmentConfig(id=args.env, kwargs=kwargs)
    config = msgspec.structs.replace(config, environments=[env_config])
    tokenizer, tokenizer_name = plan_tokenizer(config)
    budget = measure_environments(config, tokenizer)[0]
    print(describe_budgets([budget], config, tokenizer_name))
    problem = budget_problem(budget, config)
    if problem is not None:
        print(f"error: {problem}")
    return problem is None


def _policy_line(env, actions: list[str] | None) -> str:
    from agentrl.env import has_demonstration

    if actions is not None:
        return "scripted episodes: the actions of --actions"
    if has_demonstration(env):
        return "scripted episodes: the environment's demonstrate() policy"
    return ("scripted episodes: random text (the environment has no demonstrate() policy; "
            "`agentrl sft` needs one, or a JSONL of demonstrations: "
            "docs/writing-environments.md)")


def _next_action(env, transcript: list, actions: list[str] | None, step: int) -> str:
    from agentrl.env import has_demonstration

    if actions is not None:
        return actions[step] if step < len(actions) else actions[-1]
    if has_demonstration(env):
        action = env.demonstrate(list(transcript))
        if action is not None:
            return action
        print("  (demonstrate() returned None: a random action instead)")
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
