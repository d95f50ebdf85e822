"""`agentrl view RUN_DIR`: one self-contained page, checked in a real headless Chromium.

The browser runs the page's script and dumps the DOM it built; the checks read that DOM:
the rollout list, a turn's text, compaction markers, filtering and selection through the
URL hash (the path clicks and the filters take), and hostile model text shown as text.
One test drives the page over the DevTools protocol: it clicks a rollout and changes the
filters, and reads what the page shows.
Under CI (``CI`` set) a missing Chromium fails the test; locally it skips with the fix.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.transcripts.page import script_json
from agentrl.transcripts.store import read_records
from tests.transcripts.browser import Browser, dump_dom
from tests.transcripts.conftest import PAYLOAD


def dump_page(page: Path, fragment: str, profile: Path) -> str:
    """The page's DOM after its script ran, opened with a URL fragment."""
    return dump_dom(page.resolve().as_uri() + fragment, profile)


class Elements(HTMLParser):
    """Start tags with their attributes, and all text of a DOM dump."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text += data

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.tags if name in a.get("class", "").split()]


def parse(dom: str) -> Elements:
    elements = Elements()
    elements.feed(dom)
    return elements


@pytest.fixture(scope="module")
def page(sampled_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "view.html"
    assert main(["view", str(sampled_run), "--out", str(out)]) == 0
    return out


def test_the_page_is_self_contained_and_its_data_cannot_close_the_script(page) -> None:
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched
    assert "default-src 'none'" in text
    assert text.count("<script") == 2 and text.count("</script>") == 2  # the data and ours
    assert script_json({"t": "</script><!--&"}) == '{"t":"\\u003c/script\\u003e\\u003c!--\\u0026"}'
    assert text.count('src="data:image/svg+xml;base64,') >= 6  # reward, validation, agent panels
    assert "cost per step (log.costs)" in text  # and the cost panels (the run has a price table)


def test_the_browser_builds_the_rollout_list_and_turns(page, sampled_run, tmp_path) -> None:
    dom = parse(dump_page(page, "", tmp_path / "p1"))
    last_step = read_records(sampled_run, [2])
    items = dom.with_class("rollout-item")
    assert [i["data-key"] for i in items] == [f"2:{r.rollout_id}" for r in last_step]
    shown = dom.with_class("rollout")
    assert [s["data-key"] for s in shown] == [items[0]["data-key"]]  # the first is open
    first = last_step[0]
    assert len(dom.with_class("compaction-marker")) == first.num_compactions >= 1
    assert len(dom.with_class("row")) == first.num_rows
    assert f"report 1: {PAYLOAD}" in dom.text  # a tool result, as text
    assert "earlier turn(s) were removed" in dom.text and "row 1 · advantage " in dom.text
    assert first.rows[0].spans[1].messages[0].text in dom.text  # the first generated turn
    assert f"{len(last_step)} of 12 rollouts" in dom.text


def test_filters_and_selection_through_the_hash(page, sampled_run, tmp_path) -> None:
    wanted = read_records(sampled_run, [1], env="short")
    chosen = wanted[2]
    dom = parse(dump_page(page, f"#step=1&env=short&rollout=1:{chosen.rollout_id}",
                         tmp_path / "p2"))
    items = dom.with_class("rollout-item")
    assert [i["data-key"] for i in items] == [f"1:{r.rollout_id}" for r in wanted]
    assert [i["data-key"] for i in dom.with_class("selected")] == [f"1:{chosen.rollout_id}"]
    assert [s["data-key"] for s in dom.with_class("rollout")] == [f"1:{chosen.rollout_id}"]
    assert dom.with_class("compaction-marker") == []  # the short env never compacts
    everything = parse(dump_page(page, "#step=all", tmp_path / "p3"))
    assert len(everything.with_class("rollout-item")) == 12


def test_hostile_model_text_is_shown_not_run(page, tmp_path) -> None:
    raw = dump_page(page, "#step=1&env=longtool", tmp_path / "p4")
    dom = parse(raw)
    assert PAYLOAD in dom.text  # the reader sees the text ...
    assert "&lt;script&gt;document.title" in raw  # ... serialized as text, not as a tag
    assert not [a for t, a in dom.tags if t == "img" and "onerror" in a]
    assert all("data-pwned" not in a for _, a in dom.tags)
    title = re.search(r"<title>(.*?)</title>", raw).group(1)
    assert title.startswith("agentrl · ") and "pwned" not in title
    assert sum(1 for t, _ in dom.tags if t == "script") == 2


def test_clicking_and_the_filters_work_in_a_driven_browser(page, sampled_run, tmp_path) -> None:
    browser = Browser(page.resolve().as_uri(), tmp_path / "driven")
    try:
        keys = "[...document.querySelectorAll('.rollout-item')].map(e => e.dataset.key)"
        shown = "document.querySelector('.rollout').dataset.key"
        step_two = [f"2:{r.rollout_id}" for r in read_records(sampled_run, [2])]
        browser.wait_for(f"{keys}.length === {len(step_two)}")
        assert browser.evaluate(keys) == step_two
        browser.evaluate("document.querySelectorAll('.rollout-item')[4].click()")
        browser.wait_for(f"{shown} === {step_two[4]!r}")
        assert browser.evaluate("document.querySelector('.selected').dataset.key") == step_two[4]
        assert "rollout=" in browser.evaluate("location.hash")
        longtool = [f"1:{r.rollout_id}" for r in read_records(sampled_run, [1], "longtool")]
        for select, value in (("filter-step", "1"), ("filter-env", "longtool")):
            browser.evaluate(f"(s => {{ s.value = {value!r}; s.dispatchEvent("
                             f"new Event('change')); }})(document.getElementById({select!r}))")
        browser.wait_for(f"{keys}.join() === {','.join(longtool)!r}")
        assert browser.evaluate(shown) == longtool[0]
        assert browser.evaluate("document.querySelectorAll('.compaction-marker').length") >= 1
        assert browser.evaluate("document.getElementById('rollout-count').textContent") == \
            f"{len(longtool)} of 12 rollouts"
        assert browser.evaluate("document.title").startswith("agentrl · ")  # nothing ran
    finally:
        browser.close()
