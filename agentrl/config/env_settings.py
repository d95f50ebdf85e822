"""Environment settings (``[[environments]]``, its ``harness``) and ``[endpoint]``.

Units and ranges: see ``agentrl.config.settings``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from agentrl.config.ranges import (
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    fix,
)
from agentrl.config.section import _Section


class HarnessConfig(_Section):
    """An agent program trained through the OpenAI-compatible endpoint
    (docs/harnesses.md): give ``run`` or ``command``, not both."""

    run: str = ""
    """A Python callable ``run(task, client_config) -> str`` (the final answer), as
    "path/to/file.py:function" (relative to where agentrl runs or to the config's folder)
    or "package.module:function". ``task``: {"messages", "tools", "seed", "rollout_id"};
    ``client_config``: {"base_url", "api_key", "model"} for ``openai.OpenAI(...)``."""
    command: list[str] = []
    """Or a command line, run as a subprocess once per rollout with OPENAI_BASE_URL,
    OPENAI_API_KEY, OPENAI_MODEL and AGENTRL_TASK (the task as JSON, also on stdin) in its
    environment; its final answer is the file $AGENTRL_ANSWER_FILE when it writes one,
    else its stdout (stripped); a non-zero exit status invalidates the rollout."""
    isolation: Literal["thread", "process"] = "thread"
    """``run``: where the callable runs: a thread of this process, or a worker process
    killed at the deadline (as ``AgentEnv.isolation``)."""
    sandbox: bool = False
    """``command``: run it in a bubblewrap sandbox: the host's root read-only, a private
    /tmp (and empty /run, /var/tmp, ...), its working folder read-only, its own user, PID
    and network namespaces, no network but the endpoint and no Unix socket (a seccomp
    filter), within ``max_open_files`` and ``max_processes`` (docs/security.md)."""
    max_open_files: PositiveInt = 256
    """``command`` with ``sandbox``: file descriptors the program may hold (RLIMIT_NOFILE);
    >= 1. Its connections to the endpoint are capped at 64 at once besides."""
    max_processes: PositiveInt = 256
    """``command`` with ``sandbox``: processes and threads the program's uid may run in
    its sandbox (RLIMIT_NPROC; the forwarder's two threads per open connection count);
    >= 1."""
    cwd: str = ""
    """``command``: the working folder (relative to where agentrl runs); "": that folder."""
    env: dict[str, str] = {}
    """``command``: more environment variables (in the sandbox, its whole environment is
    these, PATH, HOME, LANG and the endpoint's)."""
    timeout_s: PositiveFloat | None = None
    """Seconds the program may run in one rollout before it is killed and the rollout is
    invalid (``harness_timeout``); > 0; None: rollout.rollout_timeout_s."""
    max_requests: PositiveInt | None = None
    """Requests per rollout, over all its threads; >= 1; past it requests are refused and
    the rollout is invalid (``harness_budget``). None: rollout.max_turns. Each request
    generates at most rollout.max_new_tokens, the rollout rollout.max_rollout_tokens."""
    grader: str = ""
    """"file.py:function" or "module:function" called as ``grader(task, final)`` with the
    environment's ``Task`` (its ``answer``, ...) → a reward or a ``Grade``; "": the
    environment's own ``grade(final)``."""


class EndpointConfig(_Section):
    """Where the endpoint for agent programs listens during training (harness
    environments only; `agentrl serve` serves the same routes on its own port)."""

    host: str = "127.0.0.1"
    """Address to listen on; programs on other machines need an address they reach."""
    port: NonNegativeInt = 0
    """TCP port; 0 picks a free one. The training endpoint's: a validation's endpoint
    always listens on a free port of ``host`` (the training one keeps this port)."""
    model_name: str = "policy"
    """The model name requests must give (client_config["model"], OPENAI_MODEL)."""


class EnvironmentConfig(_Section):
    id: str
    """A registered id ("agentrl/Countdown-v0") or "package.module:ClassName"; `agentrl
    plan` builds it once to check the id, its kwargs and its data files."""
    weight: Annotated[PositiveFloat, fix("give a relative weight such as 1.0; to leave "
                                         "an environment out, remove it")] = 1.0
    """Sampling weight (relative): this environment's share of each collection's groups;
    a finite number > 0."""
    group_size: PositiveInt | None = None
    """Rollouts per group for this environment; >= 1; defaults to
    batch.n_samples_per_prompt."""
    reward_scale: PositiveFloat = 1.0
    """Multiplies this environment's rewards before advantages; a finite number > 0 (0
    would erase the reward, a negative scale invert it)."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments for the environment's constructor."""
    name: str = ""
    """Short name in metrics; defaults to the id's last part."""
    harness: HarnessConfig | None = None
    """An agent program plays this environment's tasks through the OpenAI-compatible
    endpoint instead of the built-in loop; the environment gives the tasks (``reset``)
    and grades the program's final answer (``grade``). See docs/harnesses.md."""

    def display_name(self) -> str:
        """The name this environment has in metrics and reports."""
        if self.name:
            return self.name
        return self.id.split("/")[-1].split(":")[-1]
