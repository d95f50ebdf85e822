"""One rollout of an agent program: the environment's task, the program run once under
its deadline, the final answer graded (docs/harnesses.md).

The environment (the task source and grader) is contained like any other
(:class:`agentrl.rollout.env_guard.GuardedEnv`). The program runs where its config says:

- ``run`` (a callable): on its own thread, or in a worker process killed at the deadline
  (``isolation = "process"``), through the same callers as environment methods;
- ``command``: a subprocess in its own session (its whole process group is killed at the
  deadline and when it ends), optionally in the bubblewrap sandbox.

Whatever goes wrong invalidates this rollout only, with a named kind: the endpoint's
reason when it refused a request (``harness_budget``, ``harness_foreign_model``,
``harness_bad_request``, ...), else the program's (``harness_raised``,
``harness_timeout``, ``harness_bad_final``, ``harness_bad_answer``), else the grader's.
The rows are whatever the session recorded, over all its threads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shlex
import shutil
import signal
import stat
import tempfile
from typing import Any

from agentrl.config import HarnessConfig, RolloutConfig
from agentrl.envs.harness import HarnessProgram, own_python, play_task
from agentrl.rollout.env_contract import EnvError, describe, scaled_reward
from agentrl.rollout.env_guard import GuardedEnv
from agentrl.rollout.env_process_caller import ProcessCaller
from agentrl.rollout.env_thread_caller import ThreadCaller
from agentrl.rollout.harness_endpoint import HarnessEndpoint
from agentrl.rollout.harness_session import HarnessSession
from agentrl.rollout.multi_turn import RolloutSpec
from agentrl.text import brief
from agentrl.types import Compaction, Rollout, RolloutStats, Segment, as_dicts

ANSWER_FILE = "answer.txt"


async def play_harness_rollout(spec: RolloutSpec, env: GuardedEnv, harness: HarnessConfig,
                               endpoint: HarnessEndpoint, rollout: RolloutConfig
                               ) -> tuple[Rollout, EnvError | None]:
    """Task, program, grade: the rollout, and the failure (with its traceback) that made
    it invalid, if one did."""
    session: HarnessSession | None = None
    failure: EnvError | None = None
    reward, components = 0.0, {}
    try:
        messages = await env.reset(spec.task_seed)
        task = {"messages": as_dicts(messages), "tools": await env.tool_schemas(),
                "seed": spec.task_seed, "rollout_id": spec.rollout_id}
        await endpoint.start(unix_socket=harness.sandbox)
        session = endpoint.open(spec.rollout_id, spec.sampling_seed, harness.max_requests)
        try:
            final = await run_program(harness, task, endpoint, session, spec.env,
                                      harness.timeout_s or rollout.rollout_timeout_s,
                                      rollout.max_observation_chars)
        except EnvError as exc:
            failure = exc
        finally:
            endpoint.end(session)
        if session.failure is not None:  # the endpoint's reason is the precise one
            failure = EnvError(session.failure[0], f"env {spec.env!r}: {session.failure[1]}")
        if failure is None:
            reward, components = await env.grade(final, harness.grader)
    except EnvError as exc:
        failure = failure or exc
    return _rollout(spec, session, reward, components, failure)


def _rollout(spec: RolloutSpec, session: HarnessSession | None, reward: float,
             components: dict[str, float], failure: EnvError | None
             ) -> tuple[Rollout, EnvError | None]:
    stats = RolloutStats()
    segments, threads = [], []
    if session is not None:
        segments, threads = session.segments(), session.thread_tree()
        compactions = harness_compactions(segments)
        stats = RolloutStats(
            num_turns=session.num_completions, num_compactions=len(compactions),
            num_generated_tokens=sum(s.num_generated_tokens for s in segments),
            compactions=compactions, num_drift=session.num_drift, spend=session.spend)
    scaled, bad = scaled_reward(spec.env, reward, spec.reward_scale)
    failure = failure or bad
    if failure is not None:
        stats.error, stats.error_kind = str(failure), failure.kind
    return Rollout(rollout_id=spec.rollout_id, group_id=spec.group_id, env=spec.env,
                   segments=segments, reward=scaled, valid=failure is None, stats=stats,
                   reward_components=components, threads=threads), failure


def harness_compactions(segments: list[Segment]) -> list[Compaction]:
    """A compaction (cause "harness", its reason as the strategy) for every row that a
    request not extending its thread's previous one started; ``segment`` is the row
    before it (the same thread's: a session lists its rows thread by thread)."""
    return [Compaction("harness", segment.boundary.partition(":")[2], index - 1)
            for index, segment in enumerate(segments)
            if segment.boundary.startswith("harness_compaction:")]


async def run_program(harness: HarnessConfig, task: dict[str, Any], endpoint: HarnessEndpoint,
                      session: HarnessSession, name: str, timeout_s: float,
                      max_chars: int) -> str:
    """Run the program once on ``task``; its final answer (EnvError on any failure)."""
    client = endpoint.client_config(session)
    if harness.run:
        final = await _run_callable(harness, task, client, name, timeout_s)
    else:
        final = await _run_command(harness, task, client, endpoint, name, timeout_s,
                                   max_chars)
    if not isinstance(final, str):
        raise EnvError("harness_bad_final", f"env {name!r}: the harness returned "
                       f"{describe(final)}; expected its final answer as a str")
    return final


async def _run_callable(harness: HarnessConfig, task: dict[str, Any], client: dict[str, str],
                        name: str, timeout_s: float) -> Any:
    caller = ProcessCaller(name) if harness.isolation == "process" else ThreadCaller(name)
    try:
        await caller.construct(functools.partial(HarnessProgram, harness.run), timeout_s)
    except EnvError as exc:  # the callable could not be loaded
        raise EnvError("harness_raised", f"env {name!r}: loading harness.run = "
                       f"{harness.run!r} failed: {exc}", exc.traceback) from None
    try:
        return await caller.call(play_task, (task, client), {}, timeout_s, what="harness")
    finally:
        await caller.close(timeout_s)


async def _run_command(harness: HarnessConfig, task: dict[str, Any], client: dict[str, str],
                       endpoint: HarnessEndpoint, name: str, timeout_s: float,
                       max_chars: int) -> str:
    owner = _program_uid(harness)
    own_dir = _own_folder(owner)
    # held open from the start: the answer is read in this folder even if its path is
    # swapped meanwhile (O_NOFOLLOW guards the file's own name only)
    folder_fd = os.open(own_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        argv, env, popen = _command_line(harness, task, client, endpoint, own_dir)
        where = shlex.join(harness.command)[:120]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=os.path.abspath(harness.cwd or "."),
                start_new_session=True, **popen)
        except OSError as exc:
            raise EnvError("harness_raised", f"env {name!r}: cannot start the harness "
                           f"command {where}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(
                _communicate(proc, json.dumps(task).encode(), max_chars), timeout_s)
        except TimeoutError:
            raise EnvError("harness_timeout", f"env {name!r}: the harness command {where} "
                           f"was killed after {timeout_s:g} s") from None
        finally:
            _kill_group(proc.pid)
            await proc.wait()
        if proc.returncode != 0:
            said = err.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise EnvError("harness_raised", f"env {name!r}: the harness command {where} "
                           f"exited with status {proc.returncode}: "
                           f"{brief(' / '.join(said)) or 'no output on stderr'}")
        answer = read_answer(ANSWER_FILE, owner, max_chars, name, folder_fd)
        return out.decode("utf-8", "replace").strip() if answer is None else answer
    finally:
        os.close(folder_fd)
        _remove_folder(own_dir)


def _program_uid(harness: HarnessConfig) -> int:
    """The host uid the program runs as: the sandbox's, or the trainer's own."""
    if not harness.sandbox:
        return os.geteuid()
    from agentrl.sandbox.bwrap import host_uid

    return host_uid()


def _own_folder(owner: int) -> str:
    """A fresh folder for the program's answer file that only ``owner`` may write (mode
    0700: no other local user can plant an answer in it)."""
    folder = tempfile.mkdtemp(prefix="agentrl-harness-")
    if owner != os.geteuid():
        os.chown(folder, owner, owner)
    return folder


def read_answer(path: str, owner: int, max_chars: int, name: str,
                dir_fd: int | None = None) -> str | None:
    """The program's answer file (``path``, relative to ``dir_fd`` when given), read as
    untrusted data: None when it left none; opened without following a link or blocking,
    taken only as a regular file of ``owner``, at most ``max_chars`` bytes; anything else
    is an EnvError (``harness_bad_answer``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symbolic link
        raise EnvError("harness_bad_answer", f"env {name!r}: the answer file cannot be "
                       f"read as a regular file ({exc.strerror}); it must be a plain file "
                       "the program wrote") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
            raise EnvError("harness_bad_answer", f"env {name!r}: the answer file is not a "
                           f"regular file owned by the program's uid {owner} (mode "
                           f"{info.st_mode:o}, uid {info.st_uid}); it was not read")
        kept = bytearray()
        while len(kept) < max_chars and (chunk := os.read(fd, max_chars - len(kept))):
            kept += chunk
    finally:
        os.close(fd)
    return kept.decode("utf-8", "replace").strip()


def _remove_folder(folder: str) -> None:
    """Remove the program's folder whatever it left there (subfolders it made unreadable
    included); never raises."""
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                try:
                    os.chmod(path, 0o700)
                except OSError:
                    pass
    shutil.rmtree(folder, ignore_errors=True)


def _command_line(harness: HarnessConfig, task: dict[str, Any], client: dict[str, str],
                  endpoint: HarnessEndpoint, own_dir: str
                  ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """argv, environment and extra Popen keywords of the program (sandboxed or not)."""
    env = {**harness.env, "OPENAI_BASE_URL": client["base_url"],
           "OPENAI_API_KEY": client["api_key"],
           "OPENAI_MODEL": client["model"], "AGENTRL_TASK": json.dumps(task),
           "AGENTRL_ANSWER_FILE": os.path.join(own_dir, ANSWER_FILE)}
    command = own_python(harness.command)  # "python": agentrl's interpreter, as OpenEnv's
    if not harness.sandbox:
        return command, {**os.environ, **env}, {}
    from agentrl.sandbox.program import INSIDE, inside_base_url, sandboxed_program

    assert endpoint.socket_path is not None  # started with unix_socket=True
    env.update(OPENAI_BASE_URL=inside_base_url(),
               AGENTRL_ANSWER_FILE=f"{INSIDE}/{ANSWER_FILE}")
    argv, popen = sandboxed_program(command, endpoint.socket_path, own_dir,
                                    os.path.abspath(harness.cwd or "."), env,
                                    harness.max_open_files, harness.max_processes)
    return argv, {}, popen


async def _communicate(proc: Any, stdin: bytes, max_chars: int) -> tuple[bytes, bytes]:
    """Feed stdin, read both outputs to their end, keeping the first ``max_chars`` bytes
    of each (a flood is read and dropped, never held)."""

    async def keep(stream: Any) -> bytes:
        kept = bytearray()
        while chunk := await stream.read(65536):
            kept += chunk[:max(max_chars - len(kept), 0)]
        return bytes(kept)

    async def feed() -> None:
        try:
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it did not read its task from stdin
        finally:
            proc.stdin.close()

    _, out, err = await asyncio.gather(feed(), keep(proc.stdout), keep(proc.stderr))
    return out, err


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
