"""Cost of writing a step's rollout sample (``log.rollouts_every``), against a baseline.

    python -m bench.rollout_sample [--envs 4] [--rollouts 128] [--rows 3] [--row-tokens 8000]

Builds one step of long compacted rollouts (real chat-template text through the tiny
tokenizer) and times, side by side: writing the step's sample (choose best / worst /
random per environment, decode, JSON, write) and msgpack-encoding the whole collection
once, which every multi-rank step already pays to broadcast its rollouts. Prints both, the
ratio, and the bytes written per step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import msgspec

from agentrl.model import build_tiny_checkpoint, load_tokenizer
from agentrl.reassembler import to_rows
from agentrl.transcripts.store import RolloutSampleWriter
from agentrl.types import Rollout, RolloutStats, Segment

TURN = ("<|im_start|>assistant\nI will search the logs for the error.\n<tool_call>\n"
        '{{"name": "grep", "arguments": {{"pattern": "timeout {i}"}}}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nline {i}: request timeout after 30 s on host "
        "db-{i}\n</tool_response><|im_end|>\n")


def make_rollouts(tokenizer, envs: int, rollouts: int, rows: int,
                  row_tokens: int) -> list[Rollout]:
    """``envs`` × ``rollouts`` rollouts of ``rows`` segments of about ``row_tokens`` each."""
    text = "".join(TURN.format(i=i) for i in range(row_tokens // 40))
    ids = tokenizer.encode(text)[:row_tokens]
    mask = [(i // 25) % 2 for i in range(len(ids))]  # alternating generated / observation
    segment = Segment(ids, mask, [0.0] * len(ids), 200)
    out = []
    for e in range(envs):
        for r in range(rollouts):
            stats = RolloutStats(num_turns=rows * 10, num_compactions=rows - 1)
            out.append(Rollout(f"s1-g{r // 8}-r{r % 8}", f"s1-g{r // 8}", f"env{e}",
                               [segment] * rows, float(r % 3) / 2, stats=stats))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=128, help="per environment")
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--row-tokens", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_tokenizer(build_tiny_checkpoint(Path(tmp) / "m", hidden_size=32,
                                                         num_layers=1, vocab_size=400))
        rollouts = make_rollouts(tokenizer, args.envs, args.rollouts, args.rows,
                                 args.row_tokens)
        rows = to_rows(rollouts)
        advantages = [0.0] * len(rows)
        writer = RolloutSampleWriter(Path(tmp) / "run", tokenizer, every=1, num_random=2,
                                     seed=0)
        sample_s, broadcast_s, size = [], [], 0.0
        for step in range(1, args.repeat + 1):
            figures = writer.write(step, rollouts, rows, advantages)
            sample_s.append(figures["time/rollout_sample"])
            size = figures["log/rollout_sample_bytes"]
            start = time.perf_counter()
            msgspec.msgpack.encode(rollouts)
            broadcast_s.append(time.perf_counter() - start)
    tokens = sum(len(s.token_ids) for r in rollouts for s in r.segments)
    print(f"collection: {len(rollouts)} rollouts, {tokens:,} tokens; sample: "
          f"{args.envs} envs × 4 rollouts")
    print(f"write sample       {min(sample_s) * 1e3:8.1f} ms  ({size / 1e6:.2f} MB per step)")
    print(f"encode collection  {min(broadcast_s) * 1e3:8.1f} ms  (the broadcast's cost)")
    print(f"ratio              {min(sample_s) / min(broadcast_s):8.2f}×")


if __name__ == "__main__":
    main()
