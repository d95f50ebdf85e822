"""TRL's side of ``bench/peers/trl_grpo.py``: GRPOTrainer on Countdown, graded by the same
agentrl environment. Runs in the TRL venv (agentrl on PYTHONPATH); prints one JSON line."""

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
    env = make("agentrl/Countdown-v0", **spec["env_kwargs"])
    rows = []
    for seed in range(spec["prompts"] * spec["steps"]):
        messages, _ = env.reset(seed=seed)
        rows.append({"prompt": [{"role": m.role, "content": m.content} for m in messages],
                     "seed": seed})

    def countdown_reward(prompts, completions, seed, **_):
        rewards = []
        for completion, task_seed in zip(completions, seed, strict=True):
            env.reset(seed=task_seed)
            rewards.append(float(env.step(completion[0]["content"])[1]))
        return rewards

    class Timer(TrainerCallback):
        rewards: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    config = GRPOConfig(
        output_dir=spec["out"], max_steps=spec["steps"], learning_rate=spec["lr"],
        per_device_train_batch_size=spec["prompts"] * spec["samples"],
        num_generations=spec["samples"], max_completion_length=spec["max_new_tokens"],
        temperature=1.0, beta=0.0, loss_type="dapo", logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, seed=spec["seed"], lr_scheduler_type="constant",
        warmup_steps=0, shuffle_dataset=False, dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=countdown_reward, args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[timer])
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    print(json.dumps({"train_s": seconds, "steps": spec["steps"], "rewards": timer.rewards,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
