"""What a sandboxed run is given (limits, isolation) and what it returns."""

from __future__ import annotations

from typing import Literal

import msgspec

from agentrl.config import ConfigError

Isolation = Literal["bwrap", "process"]
"""``bwrap``: Linux namespaces through bubblewrap (the default, see docs/security.md).
``process``: a plain subprocess with rlimits and an audit hook (weaker; opt-in only)."""

ISOLATIONS: tuple[str, ...] = ("bwrap", "process")


class SandboxLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits of one run."""

    cpu_s: int = 5
    """CPU seconds per process (RLIMIT_CPU)."""
    wall_s: float = 10.0
    """Wall-clock seconds before every process of the run is killed."""
    memory_mb: int = 512
    """Address space per process in MiB (RLIMIT_AS)."""
    max_output_bytes: int = 8_000
    """Bytes of stdout and of stderr returned to the caller; the rest is cut."""
    max_file_bytes: int = 1_000_000
    """Largest file the code may write, in bytes (RLIMIT_FSIZE); a stdout or stderr longer
    than this ends the run ("output_limit")."""
    max_processes: int = 16
    """Processes and threads the code may have at once, its interpreter included
    (RLIMIT_NPROC, counted per run in its own user namespace; ``bwrap`` only)."""
    scratch_mb: int = 64
    """Total MiB the code may store in its scratch folder /tmp (a size-limited tmpfs;
    ``bwrap`` only)."""

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"sandbox limit {name} = {value!r}; it must be a finite "
                                 "number > 0")


class SandboxResult(msgspec.Struct):
    """What one run produced and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The process's exit status; negative: killed by that signal."""
    error: str | None = None
    """None, "timeout", "cpu_limit", "output_limit", "memory_limit", "exit_status" or
    "abandoned" (the environment call it served passed its deadline)."""
    truncated: bool = False
    """stdout or stderr was longer than max_output_bytes and was cut."""
    isolation: dict[str, str] = {}
    """How the run was isolated: {"mechanism": "bwrap"|"process",
    "network": "namespace"|"audit_hook", "user": ...}."""


class SandboxUnavailableError(ConfigError):
    """The configured isolation cannot run on this machine; the message names the fix."""


def describe(result: SandboxResult) -> str:
    """The result as text for the model: output, errors and why the run stopped."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr.rstrip()}")
    if result.truncated:
        parts.append("[output truncated]")
    messages = {
        "timeout": "[killed: wall-clock limit reached]",
        "cpu_limit": "[killed: CPU time limit reached]",
        "output_limit": "[killed: output or file size limit reached]",
        "memory_limit": "[failed: memory limit reached]",
        "exit_status": f"[exit status {result.exit_code}]",
        "abandoned": "[killed: the step it belonged to passed its deadline]",
    }
    if result.error in messages:
        parts.append(messages[result.error])
    return "\n".join(parts) if parts else "[no output]"
