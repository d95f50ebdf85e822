"""The sandbox for model-written code: Linux namespaces through bubblewrap (docs/security.md).

``run_python(code, limits, isolation)`` runs a Python program and returns what it printed
and why it stopped. ``isolation="bwrap"`` (the default) is the boundary: fresh namespaces,
a read-only root holding only the interpreter, a private size-limited scratch tmpfs, kernel
rlimits, nothing left running afterwards. ``isolation="process"`` is the weaker fallback
(a host subprocess with rlimits and an audit hook) that a configuration must choose
explicitly. ``python -m agentrl.sandbox`` says whether this machine can run the sandbox.
"""

from agentrl.sandbox.launch import bwrap_problem, require_isolation, run_python
from agentrl.sandbox.types import (
           ISOLATIONS,
           Isolation,
           SandboxLimits,
           SandboxResult,
           SandboxUnavailableError,
           describe,
)

__all__ = ["ISOLATIONS", "Isolation", "SandboxLimits", "SandboxResult",
           "SandboxUnavailableError", "bwrap_problem", "describe", "require_isolation",
           "run_python"]
