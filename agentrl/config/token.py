"""The run's shared token for agentrl's servers (docs/security.md, "Network"): where it is
read from and the header a client sends. It lives with the config so every client, the
OpenEnv adapter among them, reads it the same way as the servers check it
(:mod:`agentrl.engines.auth`)."""

from __future__ import annotations

import os
from pathlib import Path

TOKEN_ENV = "AGENTRL_TOKEN"
TOKEN_FILE_ENV = "AGENTRL_TOKEN_FILE"
MIN_TOKEN_CHARS = 16
"""Shortest token accepted (``python -c "import secrets; print(secrets.token_hex(32))"``
makes a good one)."""


def load_token(token_file: str | None = None) -> str | None:
    """The shared token: from ``token_file``, else ``$AGENTRL_TOKEN``, else the file
    ``$AGENTRL_TOKEN_FILE``; None when none is given. ValueError for an empty or short
    token, or a file that cannot be read, naming where it came from."""
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if token_file is None and os.environ.get(TOKEN_ENV):
        token, where = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    elif path:
        try:
            token, where = Path(path).read_text().strip(), f"token file {path}"
        except OSError as exc:
            raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from None
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the token from {where} has {len(token)} characters; use at least "
                         f"{MIN_TOKEN_CHARS} (python -c \"import secrets; "
                         "print(secrets.token_hex(32))\")")
    return token


def token_headers(token: str | None) -> dict[str, str]:
    """The header a client sends with every request (none without a token)."""
    return {"X-Agentrl-Token": token} if token else {}
