"""``agentrl check-env ID_OR_MODULE:CLASS``: scripted rollouts plus Gymnasium's checker.

Prints the tools offered (schemas), the context budget (the first prompt's tokens: system
prompt, tool schemas, first observation, measured with the chat template and tokenizer of
``--config``'s model, else the tiny built-in one, against ``compaction.max_context_tokens``),
then for each episode the transcript and the reward, then the result of Gymnasium's
``check_env``. Actions come from ``--actions FILE`` (a JSON list of strings, or plain text
with actions separated by lines holding only ``---``), else the environment's
``demonstrate`` policy when it has one, else random text from the action space.

The long-trace contract is checked before any training: after the first episode its
``needed_facts`` and ``demonstrate_summary`` are called and type-checked
(:mod:`agentrl.envs.hook_checks`); with ``--config`` (and ``--set``, as every command
takes) ``--num-demonstrations`` scripted episodes are then played through the rollout
runner under the config's compaction strategy, budget and limits, exactly as ``agentrl
sft`` plays them (:mod:`agentrl.train.demonstration_check`), and any the config cuts
short is reported with its token counts. Every problem is one line naming the
environment, the method or setting, and the fix.

The environment runs in a worker process and every call goes through the runner's own
containment (:class:`agentrl.rollout.env_guard.GuardedEnv`): each call has a deadline
(``--timeout``), an episode at most ``--max-steps`` steps, and what ``reset``/``step``
return is checked by the same code as in training, so a violation is reported in the
same words (``env 'x': step() returned reward 'high' (str); expected a finite float``).
``--adversarial`` also sends every text of :mod:`agentrl.envs.adversarial` (huge, nested,
surrogates, malformed tool calls naming the environment's first tool) as one step of a
fresh instance and reports what broke. Exit status: 0 all good, 1 a check failed, the
environment broke its contract or its first prompt does not fit the budget, 2 the
environment could not be found.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json

HELP = "Check an environment: Gymnasium's env checker, tool schemas, scripted rollouts."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the environment, episodes, actions file, seed, kwargs, limits."""
    from agentrl.commands.sft import add_play_arguments
    from agentrl.config import RolloutConfig

    parser.add_argument("env", help="registered id (agentrl/Countdown-v0), module:Class, or the "
                                    "URL of an OpenEnv server (http://host:port)")
    parser.add_argument("--episodes", type=int, default=1, help="scripted rollouts to run")
    parser.add_argument("--actions", help="file of actions: JSON list, or text split by ---")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument("--kwargs", default="{}", help="constructor kwargs as JSON")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds one call (reset, step, ...) may take; the constructor "
                             "and Gymnasium's checker get 3x")
    parser.add_argument("--max-steps", type=int, default=64,
                        help="steps an episode may take before it is reported as endless")
    parser.add_argument("--adversarial", action="store_true",
                        help="also step every adversarial text (agentrl.envs.adversarial) once")
    parser.add_argument("--max-observation-chars", type=int,
                        default=RolloutConfig().max_observation_chars,
                        help="characters one reset or step may return (as in training)")
    parser.add_argument("--retries", type=int, default=RolloutConfig().max_retries,
                        help="extra attempts of a constructor or reset that fails, as "
                             "rollout.max_retries retries them in training; a failure that "
                             "persists is reported with how often it happened")
    parser.add_argument("--config", default=None,
                        help="a TOML config whose model tokenizer, compaction and rollout "
                             "settings the context budget is measured against and the "
                             "scripted episodes are played under, as `agentrl sft` plays "
                             "them (default: the tiny built-in tokenizer and default "
                             "settings); when the config lists the same id, its entry is "
                             "checked, with --kwargs laid over its kwargs")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one config setting")
    parser.add_argument("--base", default=None,
                        help="the tokenizer to measure and play with, as `agentrl sft "
                             "--base`: a model folder, 'base' (the generic base), 'new' or "
                             "'curriculum' "
                             "(default: model.path's; when `agentrl sft` has not written it "
                             "yet, the one it starts from)")
    parser.add_argument("--num-demonstrations", type=int, default=16,
                        dest="num_demonstrations",
                        help="with --config (or --set): scripted episodes played through "
                             "the rollout runner under the config, as `agentrl sft` plays "
                             "them (0: none)")
    add_play_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the checks; exit status 1 when one fails, 2 when the environment is unknown."""
    from agentrl.envs.registry import make, resolve
    from agentrl.train.env_check import check_environment

    args.env_id, args.env_kwargs = environment_of(args.env, json_kwargs(args.kwargs))
    from agentrl.train.demonstration_check import config_for_check

    args.run_config = config_for_check(args.config, args.overrides, args.env_id,
                                       args.env_kwargs)
    env_config = args.run_config.environments[0]
    args.env_id, args.env_kwargs = env_config.id, env_config.kwargs
    args.name = env_config.display_name()
    try:
        resolve(args.env_id)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    from agentrl.config import ConfigError
    from agentrl.train.demonstration_check import check_tokenizer

    try:  # before the event loop: fitting the tokenizer `agentrl sft` would use plays
        args.tokenizer, args.tokenizer_name, args.stand_in = check_tokenizer(
            args.run_config, args.base)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 1
    factory = functools.partial(make, args.env_id, **args.env_kwargs)
    status = asyncio.run(check_environment(args, factory))
    if status == 0 and args.stand_in:  # the episode and the hooks passed: say what failed
        print(f"error: {args.stand_in}")
        return 1
    under_config = args.config is not None or bool(args.overrides)
    if status == 0 and under_config and args.num_demonstrations > 0 and args.actions is None:
        status = _play_as_sft(args)
    return status


def _play_as_sft(args: argparse.Namespace) -> int:
    """Scripted episodes under the config, as `agentrl sft` plays them; 1 on a problem."""
    from agentrl.train.demonstration_check import play_as_sft
    from agentrl.train.sft import WarmStartConfig

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    ws = WarmStartConfig(num_demonstrations=args.num_demonstrations, strategies=strategies,
                         compact_share=args.compact_share)
    summary, problems = play_as_sft(args.run_config, args.tokenizer, ws)
    print(summary)
    for problem in problems:
        print(f"error: {problem}")
    return 1 if problems else 0


def environment_of(env: str, kwargs: dict) -> tuple[str, dict]:
    """The id and kwargs to build: an OpenEnv server's URL is ``agentrl/OpenEnv-v0``."""
    if env.startswith(("http://", "https://", "ws://", "wss://")):
        from agentrl.envs.registry import OPENENV_ID

        return OPENENV_ID, {**kwargs, "url": env}
    return env, kwargs


def json_kwargs(text: str) -> dict:
    from agentrl.config import ConfigError

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--kwargs is not JSON ({exc}); e.g. '{{\"num_numbers\": 2}}'") from None
    if not isinstance(value, dict):
        raise ConfigError("--kwargs must be a JSON object")
    return value
