// agentrl view: builds the rollout browser from the JSON in #rollout-data.
// Model text is untrusted: it only ever reaches the page through textContent.
// The filters live in the URL hash (#step=3&env=calc&rollout=3:s3-g0-r1), so a view can
// be linked to, and clicking and filtering go through one path: hashchange -> render.
"use strict";
(function () {
  const rollouts = JSON.parse(document.getElementById("rollout-data").textContent).rollouts;
  const stepSelect = document.getElementById("filter-step");
  const envSelect = document.getElementById("filter-env");
  const list = document.getElementById("rollout-list");
  const view = document.getElementById("rollout-view");
  const count = document.getElementById("rollout-count");
  const steps = [...new Set(rollouts.map((r) => r.step))].sort((a, b) => a - b);
  const envs = [...new Set(rollouts.map((r) => r.env))].sort();

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function option(value, label) {
    const node = el("option", "", label);
    node.value = value;
    return node;
  }

  function signed(x) {
    const v = Number(x);
    return (v >= 0 ? "+" : "") + (Math.round(v * 1000) / 1000);
  }

  function versions(list) {
    return list.length === 1 ? String(list[0]) : list[0] + "–" + list[list.length - 1];
  }

  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  function keyOf(r) {
    return r.step + ":" + r.rollout_id;
  }

  function state() {
    const params = new URLSearchParams(window.location.hash.slice(1));
    const last = steps.length ? String(steps[steps.length - 1]) : "all";
    return {
      step: params.get("step") || last,
      env: params.get("env") || "all",
      rollout: params.get("rollout") || "",
    };
  }

  function go(next) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(next)) if (v) params.set(k, v);
    window.location.hash = params.toString();
  }

  function matches(r, s) {
    return (s.step === "all" || String(r.step) === s.step) && (s.env === "all" || r.env === s.env);
  }

  function advantages(r) {
    const values = [...new Set(r.rows.map((row) => signed(row.advantage)))];
    return values.join(" / ") || "—";
  }

  function badge(text, kind) {
    return el("span", "badge " + (kind || ""), text);
  }

  function listItem(r, selected, s) {
    const item = el("li", "rollout-item" + (selected ? " selected" : ""));
    item.dataset.key = keyOf(r);
    item.dataset.env = r.env;
    item.dataset.step = r.step;
    item.append(el("span", "item-title", "step " + r.step + " · " + r.env + " · " + r.selection));
    const line = el("span", "item-figures");
    line.append(badge("reward " + r.reward), badge("adv " + advantages(r)),
      badge(plural(r.num_rows, "row")), badge(plural(r.num_turns, "turn")));
    if (r.num_compactions) line.append(badge(r.num_compactions + " compacted", "compaction"));
    if ((r.threads || []).length) line.append(badge(plural(r.threads.length, "subagent"), "thread"));
    if (!r.valid) line.append(badge("invalid", "invalid"));
    if (r.truncated) line.append(badge("truncated", "truncated"));
    item.append(line);
    item.addEventListener("click", () => go({ step: s.step, env: s.env, rollout: keyOf(r) }));
    return item;
  }

  function summary(r) {
    const box = el("div", "rollout-figures");
    box.append(badge("reward " + r.reward, "reward"));
    box.append(r.valid ? badge("valid", "valid")
      : badge("INVALID: " + (r.invalid_reason || "no reason given") + " → masked", "invalid"));
    box.append(badge(plural(r.num_turns, "turn")), badge(plural(r.num_compactions, "compaction")),
      badge(plural(r.num_rows, "row")),
      badge(r.num_tokens + " tokens (" + r.num_generated_tokens + " generated)"));
    if (r.truncated) {
      box.append(badge("truncated" + (r.truncation_reason ? ": " + r.truncation_reason : ""),
        "truncated"));
    }
    for (const [reason, n] of Object.entries(r.compaction_reasons || {})) {
      box.append(badge("harness compaction " + reason + " × " + n, "compaction"));
    }
    if (r.num_drift) box.append(badge("drift × " + r.num_drift, "invalid"));
    for (const [kind, n] of Object.entries(r.tool_errors || {})) {
      box.append(badge("tool error " + kind + " × " + n, "invalid"));
    }
    for (const [name, v] of Object.entries(r.reward_components || {})) {
      box.append(badge(name + " " + v));
    }
    if ((r.policy_versions || []).length) {
      box.append(badge("policy versions " + versions(r.policy_versions)));
    }
    return box;
  }

  function bubble(message, span) {
    const node = el("div", "bubble role-" + message.role + " source-" + span.source +
      (span.summary ? " summary" : ""));
    let label = message.role;
    if (span.source === "prompt") label += " · prompt";
    if (span.summary) label += " · compaction summary";
    if (span.source === "generated") {
      label += " · " + span.num_tokens + " tokens";
      if ((span.policy_versions || []).length) label += " · policy " + versions(span.policy_versions);
    }
    const body = el("div", "bubble-body");
    for (const part of message.parts || []) body.append(el("span", "part part-" + part.kind, part.text));
    if (message.role === "system") {
      const fold = el("details", "system-fold");
      const chars = (message.parts || []).reduce((n, p) => n + p.text.length, 0);
      fold.append(el("summary", "bubble-label", label + " (" + chars + " characters)"), body);
      node.append(fold);
    } else {
      node.append(el("div", "bubble-label", label), body);
    }
    return node;
  }

  function rowView(row) {
    const section = el("section", "row" + (row.valid === false ? " invalid" : ""));
    const where = row.thread && row.thread !== "main" ? " · thread " + row.thread : "";
    let title = "row " + row.index + where + " · advantage " + signed(row.advantage) + " · " +
      row.num_tokens + " tokens (" + row.num_prompt_tokens + " prompt, " +
      row.num_generated_tokens + " generated)";
    if (row.valid === false) title += " · invalid";
    if ((row.policy_versions || []).length) title += " · policy " + versions(row.policy_versions);
    section.append(el("h4", "row-title", title));
    for (const span of row.spans || []) {
      for (const message of span.messages || []) section.append(bubble(message, span));
    }
    return section;
  }

  // The main thread, then depth first each subagent thread after its caller, indented.
  function threadBlocks(r) {
    const children = {};
    for (const t of r.threads || []) (children[t.parent || "main"] ||= []).push(t);
    const blocks = [];
    const visit = (id, depth, node) => {
      blocks.push({ depth, node, rows: r.rows.filter((row) => (row.thread || "main") === id) });
      for (const child of children[id] || []) visit(child.thread_id, depth + 1, child);
    };
    visit("main", 0, null);
    return blocks;
  }

  function threadView(block) {
    const box = el("div", block.node ? "thread subagent" : "thread");
    box.style.marginLeft = (block.depth * 24) + "px";
    const node = block.node;
    if (node) {
      box.append(el("div", "thread-call",
        "thread " + node.thread_id + " ← " + (node.parent || "main") + " called " + node.origin));
    }
    block.rows.forEach((row, number) => {
      if (number > 0) {
        box.append(el("div", "compaction-marker", row.compaction ||
          ("compaction " + number + ": row " + row.index + " starts from a compacted context")));
      }
      box.append(rowView(row));
    });
    const answered = node && node.answer !== undefined && node.answer !== null;
    const failed = node && node.error !== undefined && node.error !== null;
    if (answered || failed) {  // an agent program's other conversation returns nothing
      box.append(answered
        ? el("div", "thread-answer", "↳ returned to " + (node.parent || "main") + ": " + node.answer)
        : el("div", "thread-answer failed", "↳ no answer for " + (node.parent || "main") + " (" +
          node.error_kind + "): " + node.error));
    }
    return box;
  }

  function rolloutView(r) {
    const box = el("div", "rollout");
    box.dataset.key = keyOf(r);
    box.append(el("h3", "", r.env + " · " + r.rollout_id + " · step " + r.step + " · " + r.selection));
    box.append(summary(r));
    for (const block of threadBlocks(r)) box.append(threadView(block));
    return box;
  }

  function render() {
    const s = state();
    stepSelect.value = s.step;
    envSelect.value = s.env;
    const shown = rollouts.filter((r) => matches(r, s));
    const chosen = shown.find((r) => keyOf(r) === s.rollout) || shown[0];
    list.replaceChildren(...shown.map((r) => listItem(r, r === chosen, s)));
    count.textContent = shown.length + " of " + rollouts.length + " rollouts";
    const none = rollouts.length ? "No sampled rollouts match these filters."
      : "This run has no sampled rollouts (training writes them every log.rollouts_every steps).";
    view.replaceChildren(chosen ? rolloutView(chosen) : el("p", "empty", none));
  }

  stepSelect.append(option("all", "all steps"), ...steps.map((s) => option(String(s), "step " + s)));
  envSelect.append(option("all", "all environments"), ...envs.map((e) => option(e, e)));
  stepSelect.addEventListener("change", () => go({ step: stepSelect.value, env: envSelect.value }));
  envSelect.addEventListener("change", () => go({ step: stepSelect.value, env: envSelect.value }));
  window.addEventListener("hashchange", render);
  render();
})();
