"""TRL's side of ``bench/peers/trl_grpo.py``: GRPOTrainer on the same agentrl environment's
tasks, graded by that environment: Countdown in one turn, or Calculator through TRL's tool
calling (the same ``calculate`` tool, schema and Hermes call format).
Runs in the TRL venv (agentrl on PYTHONPATH); prints one JSON line."""

from __future__ import annotations

import json
import resource
import sys
import time


def main() -> None:
    """Train ``steps`` GRPO steps with the batch shape of the agentrl run; print timings."""
    spec = json.loads(sys.argv[1])
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.envs.registry import make

    torch.set_num_threads(spec["threads"])
    env = make(spec["env_id"], **spec["env_kwargs"])
    tools = [calculator_tool(make(spec["env_id"]))] if spec["max_turns"] > 1 else None
    rows = []
    for seed in range(spec["prompts"] * spec["steps"]):
        messages, _ = env.reset(seed=seed)
        rows.append({"prompt": [{"role": m.role, "content": m.content} for m in messages],
                     "seed": seed})

    def env_reward(prompts, completions, seed, **_):
        """The environment's grade of the last assistant message (0 when it is a call)."""
        rewards = []
        for completion, task_seed in zip(completions, seed, strict=True):
            last = completion[-1]
            if last.get("role") != "assistant" or last.get("tool_calls"):
                rewards.append(0.0)
                continue
            env.reset(seed=task_seed)
            rewards.append(float(env.step(last.get("content", ""))[1]))
        return rewards

    class Timer(TrainerCallback):
        rewards: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    config = GRPOConfig(
        output_dir=spec["out"], max_steps=spec["steps"], learning_rate=spec["lr"],
        per_device_train_batch_size=spec["prompts"] * spec["samples"],
        num_generations=spec["samples"], max_completion_length=spec["trl_completion_tokens"],
        temperature=1.0, beta=0.0, loss_type="dapo", logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, seed=spec["seed"], lr_scheduler_type="constant",
        warmup_steps=0, shuffle_dataset=False, dataloader_num_workers=0,
        max_tool_calling_iterations=spec["max_turns"] - 1, **spec.get("trl_config", {}),
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tools:  # the warm start's template is Qwen2.5's Hermes format, under another name
        from trl.chat_template_utils import qwen3_template

        tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=config, tools=tools,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[timer])
    generating = [0.0]  # seconds in TRL's generate-and-score phase of each step
    generate_and_score = trainer._generate_and_score_completions

    def timed_generation(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate_and_score(*args, **kwargs)
        finally:
            generating[0] += time.perf_counter() - start

    trainer._generate_and_score_completions = timed_generation
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    print(json.dumps({"train_s": seconds, "generate_s": generating[0], "steps": spec["steps"],
                      "rewards": timer.rewards,
                      "precision": {"mixed_precision": trainer.accelerator.mixed_precision,
                                    "gradient_checkpointing": config.gradient_checkpointing},
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def calculator_tool(env):
    """CalculatorEnv's ``calculate`` as a standalone function, with the same docstring and
    no return annotation, so TRL renders the very tool schema agentrl renders."""

    def calculate(expression: str):
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / and parentheses, e.g. "(3 + 4) * 2".
        """
        return env.calculate(expression)

    return calculate


if __name__ == "__main__":
    main()
