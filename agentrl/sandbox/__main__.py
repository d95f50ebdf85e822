"""``python -m agentrl.sandbox``: can this machine run the bubblewrap sandbox?

Prints the mechanism, the interpreter and uids it would use, or why it cannot run and the
fix; exits 0 when it can, 1 when it cannot.
"""

from __future__ import annotations

import sys

from agentrl.sandbox.bwrap import SANDBOX_UID, find_bwrap, host_uid
from agentrl.sandbox.interpreter import sandbox_interpreter
from agentrl.sandbox.launch import bwrap_problem


def main() -> int:
    """Report the sandbox's readiness on this machine."""
    problem = bwrap_problem()
    if problem is not None:
        print(f'isolation = "bwrap": NOT available: {problem}')
        return 1
    interpreter = sandbox_interpreter(host_uid())
    assert interpreter is not None
    print('isolation = "bwrap": available')
    print(f"  bwrap:       {find_bwrap()}")
    print(f"  interpreter: {interpreter.executable} (stdlib {', '.join(interpreter.stdlib_roots)})")
    print(f"  user:        uid {SANDBOX_UID} inside, host uid {host_uid()}")
    print(f"  host paths:  {1 + len(interpreter.stdlib_roots) + len(interpreter.libraries)} "
          "read-only binds (the interpreter, its stdlib, its shared libraries); no /etc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
