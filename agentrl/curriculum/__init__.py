"""The generic base model: a synthetic curriculum of the skills every long-trace tool task
needs (look a fact up anywhere in the context, its own summaries included; keep the facts a
question needs in a ``compact`` summary; add two digits; the tool-call format at any length),
never any built-in environment's task. ``configs/base.toml`` builds ``assets/base`` from it
with ``agentrl sft``; see :mod:`agentrl.curriculum.drills`."""
