"""What ``agentrl check-env`` checks (``agentrl.commands.check_env``, whose docstring says
what and why): scripted episodes through the runner's containment (``GuardedEnv``), the
long-trace hooks, Gymnasium's checker, the context budget and adversarial texts, each
printed as it runs."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any


async def check_environment(args: argparse.Namespace, factory: Any) -> int:
    """The checks of ``agentrl check-env`` on one environment, printed as they run (the
    command's docstring says which); 0 when all pass, 1 when one fails."""
    from agentrl.rollout.env_contract import EnvError
    from agentrl.rollout.env_guard import GuardedEnv

    name = args.env
    try:
        env = await _retrying(args, "the constructor", lambda: GuardedEnv.open(
            name, factory, args.timeout, args.max_observation_chars, isolation="process",
            construct_timeout_s=3 * args.timeout))
    except EnvError as exc:
        print(f"error ({exc.kind}): {exc}")
        _print_traceback(exc)
        return 1
    try:
        return await _check_open(args, env)
    except EnvError as exc:
        print(f"violation ({exc.kind}): {exc}")
        _print_traceback(exc)
        return 1
    finally:
        try:
            await env.close()
        except EnvError as exc:
            print(f"violation ({exc.kind}): {exc}")


async def _check_open(args: argparse.Namespace, env: Any) -> int:
    from agentrl.rollout.env_contract import EnvError

    print("tools offered:")
    # an environment served elsewhere declares its tools at reset
    await _retrying(args, "reset()", lambda: env.reset(args.seed))
    schemas = await env.tool_schemas()
    print(json.dumps(schemas, indent=2) if schemas else "  (none)")
    if not await _print_context_budget(args, args.env_kwargs, env):
        return 1
    actions = _load_actions(args.actions) if args.actions else None
    print(await env.caller.call(_policy_line, (actions,), {}, args.timeout, what="step"))
    for episode in range(args.episodes):  # the runner's checks first: the same words
        seed = args.seed + episode
        reward = await _episode(env, seed, actions, args)
        if reward is None:
            return 1
        print(f"episode {episode} (seed {seed}): reward {reward:g}")
        if episode == 0 and not await _hooks_hold(args, env, reward):
            return 1
    try:
        failure = await env.caller.call(_gym_check, (), {}, 3 * args.timeout, what="step")
    except EnvError as exc:
        failure = f"{exc.kind}: {exc}"
    if failure is not None:
        print(f"gymnasium check_env: FAILED: {failure}")
        return 1
    print("gymnasium check_env: passed")
    if args.adversarial:
        return await _adversarial(args, env.caller.factory, schemas)
    return 0


async def _adversarial(args: argparse.Namespace, factory: Any, schemas: list[dict]) -> int:
    """Each adversarial text as the first step of a fresh instance; 1 when any broke it."""
    import time

    from agentrl.envs.adversarial import cases
    from agentrl.rollout.env_contract import EnvError
    from agentrl.rollout.env_guard import GuardedEnv

    broken, worst = 0, (0.0, "")
    for case, text in cases(*_first_tool(schemas)).items():
        start, env = time.perf_counter(), None
        try:
            env = await GuardedEnv.open(args.env, factory, args.timeout,
                                        args.max_observation_chars, isolation="process",
                                        construct_timeout_s=3 * args.timeout)
            await env.reset(args.seed)
            await env.step(text)
            await env.close()
        except EnvError as exc:
            broken += 1
            print(f"adversarial {case!r}: {exc.kind}: {exc}")
            if env is not None:
                env.caller.kill()
        worst = max(worst, (time.perf_counter() - start, case))
    print(f"adversarial texts: {len(cases())}, broke the environment: {broken}; slowest "
          f"reset + step {worst[0]:.2f} s ({worst[1]!r})")
    return 1 if broken else 0


def _first_tool(schemas: list[dict]) -> tuple[str, str]:
    """The first tool's name and its first string parameter, for tool-call shapes."""
    for schema in schemas:
        function = schema.get("function", {})
        properties = function.get("parameters", {}).get("properties", {})
        for name, prop in properties.items():
            if isinstance(prop, dict) and prop.get("type") == "string":
                return str(function.get("name")), name
    return "calculate", "expression"


async def _retrying(args: argparse.Namespace, what: str, call: Any) -> Any:
    """``await call()``, again after a failure of the kind training retries (reset or the
    constructor failing now and then: docs/robustness.md), up to ``--retries`` more
    times; a failure that persists is raised, saying how often it happened."""
    from agentrl.rollout.env_contract import EnvError
    from agentrl.rollout.failures import INFRASTRUCTURE, failure_class

    attempts = 1 + args.retries
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except EnvError as exc:
            if failure_class(exc.kind, 0) != INFRASTRUCTURE:
                raise
            if attempt == attempts:
                exc.args = (f"{exc} (it failed all {attempts} attempts; --retries "
                            f"{args.retries})",)
                raise
            print(f"{what} failed ({exc.kind}): {exc}; retrying (attempt {attempt + 1} of "
                  f"{attempts}), as training would")


async def _episode(env: Any, seed: int, actions: list[str] | None,
                   args: argparse.Namespace) -> float | None:
    messages = await _retrying(args, "reset()", lambda: env.reset(seed))
    transcript = list(messages)
    _print_messages(messages)
    total = 0.0
    for step in range(args.max_steps):
        action = await env.caller.call(_next_action, (transcript, actions, step), {},
                                       args.timeout, what="step")
        print(f"[assistant] {action}")
        result = await _with_subagents(env, await env.step(action), "main", args, 1)
        observation, reward, terminated, truncated, info = result
        transcript += observation
        _print_messages(observation)
        total += reward
        if info.get("tool_errors"):
            print(f"  tool errors: {info['tool_errors']}")
        if terminated or truncated:
            components = info.get("reward_components") or {}
            end = "terminated" if terminated else "truncated"
            print(f"  {end}; reward {total:g} components {components}")
            return total
    print(f"endless episode: it did not end within {args.max_steps} steps (--max-steps); "
          "an environment must set terminated or truncated (AgentEnv.max_turns)")
    return None


async def _with_subagents(env: Any, result: Any, thread_id: str, args: argparse.Namespace,
                          depth: int) -> Any:
    """A step that asked for subagents: each call's thread played with the scripted
    policy, drawn indented under its caller, then the caller's step completed. Violations
    are raised in the words training uses (``agentrl.rollout.subagents.in_thread``)."""
    from agentrl.rollout.env_contract import EnvError
    from agentrl.rollout.subagents import in_thread

    calls = result.info.get("subagent_calls")
    if not calls:
        return result
    results = []
    for call in calls:
        try:
            results.append(await _play_thread(env, call, args, depth))
        except EnvError as exc:
            raise in_thread(exc, call) from None
    return await env.complete_step(thread_id, results)


async def _play_thread(env: Any, call: Any, args: argparse.Namespace, depth: int) -> Any:
    """One subagent thread, scripted; its result for the caller."""
    from agentrl.envs.subagents import SubagentResult
    from agentrl.types import Message

    indent = "    " * depth
    print(f"{indent[:-4]}  └─ thread {call.thread_id} ← {call.origin}")
    _print_messages(call.messages[1:], indent)
    for _ in range(args.max_steps):
        action = await env.caller.call(_next_thread_action, (call.thread_id,), {},
                                       args.timeout, what="step")
        _print_messages([Message("assistant", action)], indent)
        result = await env.thread_step(call.thread_id, action)
        result = await _with_subagents(env, result, call.thread_id, args, depth + 1)
        _print_messages(result.observation, indent)
        if result.terminated:
            answer = result.info.get("answer", action)
            print(f"{indent}  ↳ returns to thread {call.parent}: {answer}")
            return SubagentResult(call.thread_id, answer=answer)
        if result.truncated:
            print(f"{indent}  ↳ truncated: no answer for thread {call.parent}")
            return SubagentResult(call.thread_id, error="the subagent gave no answer",
                                  error_kind="max_turns")
    print(f"{indent}endless subagent thread: no answer within {args.max_steps} steps")
    return SubagentResult(call.thread_id, error="no answer", error_kind="max_turns")


def _next_thread_action(env: Any, thread_id: str) -> str:
    """In the worker: the demonstration policy's next message for a subagent thread (a
    plain "none" when the environment has no policy: the thread ends at once)."""
    from agentrl.envs.agent_env import has_demonstration

    if has_demonstration(env):
        action = env.demonstrate(list(env.thread_history(thread_id)))
        if action is not None:
            return action
    return "none"


async def _hooks_hold(args: argparse.Namespace, env: Any, reward: float) -> bool:
    """``needed_facts`` and ``demonstrate_summary`` called on the episode just played, in
    the worker (``agentrl.envs.hook_checks``); False after printing what is broken."""
    from agentrl.envs.hook_checks import hook_problems

    strategy = args.run_config.compaction.strategy
    problems = await env.caller.call(hook_problems, (args.name, reward, strategy), {},
                                     args.timeout, what="step")
    for problem in problems:
        print(f"error: {problem}")
    return not problems


def _gym_check(env: Any) -> str | None:
    """In the worker: Gymnasium's checker; None when it passes, else what failed."""
    from gymnasium.utils.env_checker import check_env

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(getattr(env, "unwrapped", env), skip_render_check=True)
    except Exception as exc:  # noqa: BLE001 - report any checker failure, do not crash
        return f"{type(exc).__name__}: {exc}"
    return None


def _next_action(env: Any, transcript: list, actions: list[str] | None, step: int) -> str:
    """In the worker: the given action, the demonstration policy's, or random text."""
    from agentrl.envs.agent_env import has_demonstration

    if actions is not None:
        return actions[step] if step < len(actions) else actions[-1]
    if has_demonstration(env):
        action = env.demonstrate(list(transcript))
        if action is not None:
            return action
        print("  (demonstrate() returned None: a random action instead)")
    return env.action_space.sample()


def _policy_line(env: Any, actions: list[str] | None) -> str:
    """In the worker: where the scripted episodes' actions come from."""
    from agentrl.envs.agent_env import has_demonstration

    if actions is not None:
        return "scripted episodes: the actions of --actions"
    if has_demonstration(env):
        return "scripted episodes: the environment's demonstrate() policy"
    return ("scripted episodes: random text (the environment has no demonstrate() policy; "
            "`agentrl sft` needs one, or a JSONL of demonstrations: "
            "docs/writing-environments.md)")


async def _print_context_budget(args: argparse.Namespace, kwargs: dict, env: Any) -> bool:
    """Print the first prompt's tokens against the budget (the tasks drawn through the
    guarded instance, under the deadline), with the tokenizer ``run`` chose; False when
    it does not fit or breaks."""
    from agentrl.envs.context_budget import (
        NUM_TASKS,
        budget_of_prompts,
        budget_problem,
        describe_budgets,
    )
    from agentrl.rollout.compact_tool import offered_tools
    from agentrl.rollout.env_contract import EnvError

    config = args.run_config
    try:
        heads = [await env.reset(seed) for seed in range(NUM_TASKS)]
        tools = await env.tool_schemas()
    except EnvError as exc:
        print(f"violation ({exc.kind}): {exc}")
        return False
    tools = offered_tools(config.compaction.strategy, tools)
    budget = budget_of_prompts(heads, tools or None, args.tokenizer, args.name)
    print(describe_budgets([budget], config, args.tokenizer_name))
    problem = budget_problem(budget, config)
    if args.stand_in:  # not the run's tokenizer: the episode and the hooks first
        print(f"  note: not checked against the budget ({args.stand_in})")
        return True
    if problem is not None:
        print(f"error: {problem}")
    return problem is None


def _print_traceback(exc: Any) -> None:
    if exc.traceback:
        print(exc.traceback.rstrip())


def _print_messages(messages: list, indent: str = "") -> None:
    for message in messages:
        name = f":{message.name}" if message.name else ""
        content = message.content if len(message.content) < 600 else message.content[:600] + "…"
        print(indent + f"[{message.role}{name}] {content}".replace("\n", "\n" + indent))


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
