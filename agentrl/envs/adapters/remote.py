"""Why a call to an environment served elsewhere failed: named kinds that invalidate
that rollout (``invalid/<kind>`` in the metrics) and never stop the run."""

from __future__ import annotations

REMOTE_KINDS = (
    "env_unreachable", "env_server_full", "env_disconnected", "env_server_error",
    "env_server_timeout", "env_bad_reply",
)
"""``env_unreachable``: no server answers at the URL (or the local one did not start);
``env_server_full``: it refused one more session (its session limit); ``env_disconnected``:
the connection closed during a call; ``env_server_error``: the server answered with an
error; ``env_server_timeout``: no answer within the adapter's ``timeout_s``;
``env_bad_reply``: an answer that is not what the protocol says."""


class RemoteEnvError(RuntimeError):
    """A call to a served environment failed; ``kind`` is one of :data:`REMOTE_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        assert kind in REMOTE_KINDS, kind
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple:
        return (RemoteEnvError, (self.kind, str(self)))
