"""``agentrl serve-env ID_OR_MODULE:CLASS [--port P]``: an agentrl environment as an
OpenEnv server, so OpenEnv clients (TRL's OpenEnv integration, torchforge, ART, agentrl's
own ``agentrl/OpenEnv-v0``) train on it.

The server is OpenEnv's own (``create_fastapi_app``), one environment instance per
WebSocket session; the wire types are in :mod:`agentrl.envs.adapters.openenv_server`.
Once it listens it prints ``agentrl serve-env: ID on http://HOST:PORT``; it serves until
interrupted. ``agentrl check-env http://HOST:PORT`` checks it through the network.

It listens on loopback unless ``--host`` names another address, which needs the shared
token (``--token-file`` or ``$AGENTRL_TOKEN``) that every request and WebSocket session
must then carry (docs/security.md): an environment may run code.
"""

from __future__ import annotations

import argparse
import functools
import threading
import time

HELP = "Serve an agentrl environment as an OpenEnv server (WebSocket sessions, /schema, ...)."
READY = "agentrl serve-env:"
"""The line printed once the server listens."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the environment, its kwargs, the address and token, the session limit
    and idle timeout."""
    from agentrl.commands.serve import add_address_arguments, add_token_argument

    parser.add_argument("env", help="registered id (agentrl/Calculator-v0) or module:Class")
    parser.add_argument("--kwargs", default="{}", help="constructor kwargs as JSON")
    add_address_arguments(parser)
    add_token_argument(parser)
    parser.add_argument("--max-sessions", type=int, default=64,
                        help="WebSocket sessions at once (each its own environment instance)")
    parser.add_argument("--idle-timeout-s", type=float, default=300.0,
                        help="close a WebSocket session whose client sends nothing for this "
                             "many seconds (frees its environment for the next client)")
    parser.add_argument("--expose-demonstrations", action="store_true",
                        help="put the environment's scripted next action in each session's "
                             "state (for check-env and sft through the server; never give it "
                             "to a policy)")


def run(args: argparse.Namespace) -> int:
    """Build the app and serve it until interrupted; 2 when the environment is unknown
    or cannot be served (``@subagent`` tools)."""
    from agentrl.commands.check_env import json_kwargs
    from agentrl.envs.registry import make, resolve

    try:
        resolve(args.env)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    from agentrl.config.extras import MissingExtra

    try:
        from agentrl.envs.adapters.openenv_server import build_app, unservable
    except MissingExtra as exc:
        print(f"error: {exc}")
        return 2
    if not args.idle_timeout_s > 0:
        print(f"error: --idle-timeout-s is {args.idle_timeout_s}; it must be > 0 seconds")
        return 2
    factory = functools.partial(make, args.env, **json_kwargs(args.kwargs))
    probe = factory()  # fail here, in one line, rather than in every session
    try:
        problem = unservable(probe)
    finally:
        probe.close()
    if problem is not None:
        print(f"error: agentrl serve-env cannot serve {args.env}: {problem}")
        return 2

    app = build_app(factory, args.env, args.max_sessions, args.expose_demonstrations,
                    args.idle_timeout_s)
    return serve(app, args.host, args.port, args.env, args.token_file)


def serve(app: object, host: str, port: int, name: str, token_file: str | None = None) -> int:
    """Run uvicorn (off loopback only with the shared token, which every request then
    needs); print the READY line, with an address a client can connect to, once it
    listens."""
    import uvicorn

    from agentrl.engines.auth import TokenGate, check_bind, connectable_host, guard_asgi, load_token

    try:
        token = load_token(token_file)
        check_bind(host, token, "agentrl serve-env", f"the environment {name} (its "
                   "sessions, and the code its tools run)")
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    if token is not None:
        app = guard_asgi(app, TokenGate(token, "agentrl serve-env"))
    if port == 0:
        from agentrl.envs.adapters.openenv_launch import free_port

        port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    shown = connectable_host(host)

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            print(f"{READY} {name} on http://{shown}:{port} (OpenEnv: /ws /reset /step /state "
                  "/schema /health)", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run()
    return 0
