"""``agentrl view``'s page: one self-contained HTML file with a run's curves and its
sampled rollouts.

Nothing is fetched when the page opens: the CSS and the script are inline, the curves are
SVG images inside ``data:`` URIs (made with matplotlib from ``metrics.jsonl``), and the
rollouts are JSON inside a ``<script type="application/json">`` element. Model text is
untrusted: the JSON escapes ``<``, ``>`` and ``&`` so nothing can close that element, and
the script puts text into the page only through ``textContent``, never as HTML.
"""

from __future__ import annotations

import base64
import html
import io
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from agentrl.transcripts.record import RolloutRecord

Curve = tuple[str, str]
"""(title, data URI of an SVG image)."""


def curve_images(metrics: list[dict[str, Any]]) -> list[Curve]:
    """Reward, validation accuracy when logged, the agent-side and the cost panels, vs
    step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl.observe.panels import (
        agent_panels,
        all_keys,
        cost_panels,
        draw,
        reward_panel,
        validation_panel,
    )

    keys = all_keys([metrics])
    panels = [reward_panel(keys), validation_panel(keys), *agent_panels(keys),
              *cost_panels(keys)]
    curves = []
    for panel in panels:
        if panel is None:
            continue
        fig, ax = plt.subplots(figsize=(4.6, 3.1))
        if draw(ax, panel, {"run": metrics}):
            fig.tight_layout()
            buffer = io.BytesIO()
            with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "agentrl"}):
                fig.savefig(buffer, format="svg")
            encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
            curves.append((panel.title, f"data:image/svg+xml;base64,{encoded}"))
        plt.close(fig)
    return curves


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` escaped."""
    text = msgspec.json.encode(value).decode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(title: str, facts: list[str], curves: list[Curve],
                records: list[RolloutRecord]) -> str:
    """The whole page as one string."""
    assets = resources.files("agentrl.transcripts")
    css = (assets / "page.css").read_text()
    script = (assets / "page.js").read_text()
    figures = "".join(
        f'<figure class="curve"><img alt="{html.escape(name)}" src="{uri}"></figure>'
        for name, uri in curves
    ) or '<p class="empty">No metrics logged yet.</p>'
    fact_items = "".join(f"<li>{html.escape(fact)}</li>" for fact in facts)
    return "".join([
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",
        f"<title>{html.escape(title)}</title><style>{css}</style></head><body>",
        f'<header><h1>{html.escape(title)}</h1><ul class="facts">{fact_items}</ul></header>',
        f'<section id="curves"><h2>Curves</h2><div class="curves">{figures}</div></section>',
        '<section id="rollouts"><h2>Sampled rollouts</h2><div class="filters">',
        '<label>step <select id="filter-step"></select></label>',
        '<label>environment <select id="filter-env"></select></label>',
        '<span id="rollout-count"></span></div><div class="browser">',
        '<ol id="rollout-list"></ol><article id="rollout-view"></article></div></section>',
        '<script type="application/json" id="rollout-data">',
        script_json({"rollouts": records}),
        f"</script><script>{script}</script></body></html>\n",
    ])


def write_view(run_dir: str | Path, out: str | Path | None = None,
               last_steps: int = 0) -> Path:
    """Write the page for a run folder (default ``RUN_DIR/view.html``); returns its path.

    ``last_steps`` > 0 keeps only the last that many sampled steps (a smaller page).
    """
    from agentrl.observe.writers import read_metrics
    from agentrl.transcripts.store import read_records, sampled_steps

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is not a folder; give a run folder written by "
                         "`agentrl train --out DIR`")
    metrics = read_metrics(run_dir)
    steps = sampled_steps(run_dir)
    if last_steps > 0:
        steps = steps[-last_steps:]
    records = read_records(run_dir, steps)
    if not metrics and not records:
        raise ValueError(f"{run_dir} has neither metrics.jsonl nor rollouts/; give a run "
                         "folder written by `agentrl train --out DIR`")
    envs = sorted({r.env for r in records})
    facts = [f"{len(metrics)} metric lines (last step {metrics[-1].get('step', '?')})"
             if metrics else "no metrics.jsonl",
             f"{len(records)} sampled rollouts from {len(steps)} steps"
             + (f" ({', '.join(envs)})" if envs else "")]
    page = render_page(f"agentrl · {run_dir.resolve().name}", facts, curve_images(metrics),
                       records)
    path = Path(out) if out is not None else run_dir / "view.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
