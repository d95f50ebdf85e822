"""``agentrl view RUN_DIR``: one self-contained HTML page with a run's curves and its
sampled rollouts (turns as chat, tool calls highlighted, compaction boundaries marked,
rows and advantages), browsable by step and environment. No server, no network: open
the file in any browser."""

from __future__ import annotations

import argparse

HELP = ("Write one self-contained HTML page with a run's curves and its sampled rollouts, "
        "browsable by step and environment.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the run folder, where to write, how many sampled steps to keep."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of `agentrl train`")
    parser.add_argument("--out", default=None, help="HTML file (default: RUN_DIR/view.html)")
    parser.add_argument("--last-steps", type=int, default=0,
                        help="keep only the last N sampled steps (default 0: all)")


def run(args: argparse.Namespace) -> int:
    """Write the page and say where it is."""
    from agentrl.transcripts.page import write_view

    path = write_view(args.run_dir, args.out, args.last_steps)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB); open it in a browser")
    return 0
