"""The memory plan: its per-token activation figures agree with what autograd really saves
(the measurement bench/memory.py reports), its sums by hand, and its advice makes configs
fit."""

from __future__ import annotations

import msgspec
import pytest
import torch

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.memory.activations import parameter_counts, saved_bytes_per_token
from agentrl.memory.plan import GIB, plan_memory
from agentrl.model import ModelArgs
from agentrl.model.shapes import KNOWN_SHAPES, model_shape
from agentrl.model.tiny import init_model
from agentrl.train.measure_memory import build_model, saved_bytes, synthetic_micro_batch

GSM8K = "configs/gsm8k_qwen2.5_1.5b.toml"
COUNTDOWN = "configs/countdown_qwen2.5_1.5b.toml"


def _small(family: str) -> ModelArgs:
    return ModelArgs(model_type=family, vocab_size=512, hidden_size=64, intermediate_size=160,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, attention_bias=family == "qwen2", qk_norm=family == "qwen3",
                     tie_word_embeddings=family == "qwen2")


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("after", [False, True], ids=["full_logits", "checkpointed_chunked"])
def test_plan_per_token_bytes_match_the_measurement_to_half_a_percent(family, dtype, after):
    # measured: the plan is 4 bytes per token above autograd's state in every case
    # (0.03-0.45 %: the loss's own terms are rounded to 40 bytes)
    args = _small(family)
    model = build_model(args, dtype)
    model.configure_memory(activation_checkpointing=after, logprob_chunk_tokens=64)
    measured = saved_bytes(model, synthetic_micro_batch(args.vocab_size, 256, 3),
                           chunked_head=after)
    planned = saved_bytes_per_token(args, dtype.itemsize, checkpointing=after,
                                    full_logits=not after, fp32_attention=True)  # a CPU's
    total = measured.total(args.num_hidden_layers)
    assert 0 <= planned - total <= 0.005 * total, (planned, msgspec.structs.asdict(measured))


def test_qwen25_15b_figures_by_hand():
    args = KNOWN_SHAPES["Qwen2.5-1.5B"]
    total, root, layer = parameter_counts(args)
    assert total == 1_543_714_304  # the published parameter count
    assert root == 151936 * 1536 + 1536
    # bf16, no checkpointing: 104.05 KiB per layer, 606 KiB of fp32 logits: 3.44 MiB
    assert saved_bytes_per_token(args, 2, False, full_logits=True) / 2**20 == pytest.approx(
        3.437, abs=0.001)
    # checkpointed: each layer keeps its bf16 input; rope tables 2·2·128; head: ids 8,
    # norm 4H + 8 + 2·2H, targets 8, log-sum-exp 4, loss ~40 (bench/memory.py: 12,348
    # before the norm kept its vector_norm's output, 4 more)
    head = 8 + (4 * 1536 + 8 + 4 * 1536) + 8 + 4 + 40
    assert saved_bytes_per_token(args, 2, True) == 28 * 1536 * 2 + 512 + head
    assert head <= 16 * 1024 and saved_bytes_per_token(args, 2, True) <= 0.25 * 2**20


def test_parameter_counts_equal_the_models():
    for family in ("qwen2", "qwen3"):
        args = _small(family)
        model = init_model(args, seed=0)
        assert parameter_counts(args)[0] == sum(p.numel() for p in model.parameters())


def test_recipes_fit_80_gib_next_to_vllm_at_half():
    for path in (GSM8K, COUNTDOWN):
        config = load_config(path)
        assert config.rollout.engine == "vllm" and "gpu_memory_utilization" not in (
            config.rollout.vllm_args)  # so vLLM takes the default half of the GPU
        plan = plan_memory(config, model_shape(config.model.path), 80)
        assert plan.fits and plan.activation_checkpointing
        states = next(t for t in plan.terms if t.name == "model states")
        assert states.bytes == 16 * 1_543_714_304
        assert plan.engine_bytes == 40 * GIB


NO_CHECKPOINTING = ["train.activation_checkpointing=false",
                    "batch.max_tokens_per_microbatch=32768"]


def _gsm8k_training_bytes_by_hand(tokens: int) -> int:
    """Rank 0's peak for configs/gsm8k_qwen2.5_1.5b.toml on one GPU without activation
    checkpointing, added up from Qwen2.5-1.5B's shape (H 1536, I 8960, 12 query heads and
    2 key/value heads of 128, vocab 151,936, 28 layers) without the plan's code."""
    params = 1_543_714_304
    root = 151_936 * 1536 + 1536  # embeddings + final norm (the head is tied)
    layer = (params - root) // 28
    assert layer == 46_797_824
    # one layer's autograd state per token, bf16: 2 RMSNorms (fp32 copy 4H, norm and 1/rms
    # 8, normalized and weighted 2·2H); q, k, v and SDPA's output 2·(1536+256+256+1536),
    # o_proj's input 2·1536, log-sum-exp 4·12; MLP gate, up, act, product 4·2·8960
    per_layer = 2 * (4 * 1536 + 8 + 4 * 1536) + 2 * 3584 + 2 * 1536 + 48 + 4 * 2 * 8960
    assert per_layer == 106_560  # 104.06 KiB
    # rope cos, sin 2·2·128; head: ids 8, final norm 4H + 8 + 2·2H, targets 8, lse 4, loss 40
    per_token = 28 * per_layer + 512 + (8 + (4 * 1536 + 8 + 4 * 1536) + 8 + 4 + 40)
    states = 16 * params  # fp32 master + fp32 gradient + two fp32 AdamW moments
    gathered = 2 * (root + 2 * layer)  # bf16 root unit + the computing and prefetched layer
    gradients = 4 * params  # accumulated unsharded in fp32 (FSDP2 on one rank)
    head_chunk = 1024 * 151_936 * (2 * 2 + 4) + 151_936 * 1536 * (4 + 2)  # logits + head grad
    one_layer = tokens * per_layer + 2 * root + 4 * layer  # a layer's grads + root's + buffer
    reserve = 2 * GIB
    # vLLM's 40 GiB is freed while training (colocated): the training phase is the peak
    return states + reserve + gathered + gradients + max(head_chunk, one_layer) + (
        tokens * per_token)


def test_a_config_that_does_not_fit_is_told_which_knob_fixes_it():
    # vLLM sleeps while the trainer trains (colocated), so the training phase alone must
    # pass 80 GiB: 32k tokens without checkpointing (2.9 MiB of activations per token)
    config = load_config(GSM8K, NO_CHECKPOINTING)
    args = model_shape(config.model.path)
    plan = plan_memory(config, args, 80)
    assert not plan.fits and _gsm8k_training_bytes_by_hand(32768) > 80 * GIB
    assert "train.activation_checkpointing = true" in plan.suggestions
    # the budget by hand: the largest multiple of 1024 tokens whose peak is within 80 GiB
    by_hand = max(t for t in range(1024, 32769, 1024)
                  if _gsm8k_training_bytes_by_hand(t) <= 80 * GIB)
    assert by_hand == 16384 and _gsm8k_training_bytes_by_hand(17408) > 80 * GIB
    assert plan.max_fitting_tokens == by_hand
    assert f"batch.max_tokens_per_microbatch = {by_hand}" in plan.suggestions
    fitting = plan_memory(load_config(GSM8K, [NO_CHECKPOINTING[0],
                                              f"batch.max_tokens_per_microbatch={by_hand}"]),
                          args, 80)
    assert fitting.fits and fitting.total_bytes == _gsm8k_training_bytes_by_hand(by_hand)


def test_built_in_engine_share_by_hand():
    config = load_config("configs/quickstart.toml")
    args = KNOWN_SHAPES["Qwen2.5-1.5B"]
    plan = plan_memory(config, args, 24)
    # model.dtype "auto" plans for a GPU: bf16, 2 bytes per value
    # 128 slots × (200 + 40 + 1) tokens × 28 layers × K,V × 2 kv heads × 128 × 2 bytes
    kv = 128 * 241 * 28 * 2 * 2 * 128 * 2
    assert plan.engine_bytes == kv + 2 * 1_543_714_304
    # the KV cache is freed while training (colocated): the peak holds the larger phase
    kv_term = next(t for t in plan.terms if t.name == "engine KV cache")
    assert kv_term.phase == "generation"
    training = sum(t.bytes for t in plan.terms if t.phase == "training")
    always = sum(t.bytes for t in plan.terms if t.phase == "always")
    assert plan.total_bytes == always + max(training, kv)


def test_plan_command(capsys):
    quickstart = "configs/quickstart.toml"  # its tiny model is in the repository
    assert main(["plan", quickstart, "--gpu-memory", "24"]) == 0
    out = capsys.readouterr().out
    assert "model states" in out and "engine KV cache" in out and "fits;" in out
    assert main(["plan", quickstart, "--gpu-memory", "0.05", "--ranks", "2"]) == 1
    out = capsys.readouterr().out
    assert "WARNING: does not fit" in out and "/ 2 rank(s)" in out
    # the 1.5B recipe plans on a machine without the model (known shape), then the
    # plan-time checks refuse the missing /models folder here (exit 2)
    assert main(["plan", GSM8K, "--gpu-memory", "80"]) == 2
    captured = capsys.readouterr()
    assert "engine (vLLM)" in captured.out and "fits;" in captured.out
    assert "model.path" in captured.err


def _term(plan, name):
    return next(t for t in plan.terms if t.name == name)


def test_one_fp32_rank_plans_no_fsdp2_copies():
    """One rank computing in fp32 trains the model unwrapped: no gathered parameter copies,
    no unsharded gradient copy beside the model's own; two ranks (or bf16 compute) have
    both, worked from the parameter counts."""
    args = KNOWN_SHAPES["Qwen2.5-1.5B"]
    total, root, layer = parameter_counts(args)
    fp32 = load_config("configs/countdown_qwen2.5_1.5b.toml", ['model.dtype="float32"'])
    names = {t.name for t in plan_memory(fp32, args, 80, num_ranks=1).terms}
    assert not names & {"gathered parameters", "accumulated gradients"}
    two = plan_memory(fp32, args, 80, num_ranks=2)
    assert _term(two, "gathered parameters").bytes == 4 * (root + 2 * layer)
    assert _term(two, "accumulated gradients").bytes == 4 * total
    bf16 = load_config("configs/countdown_qwen2.5_1.5b.toml", ['model.dtype="bfloat16"'])
    assert _term(plan_memory(bf16, args, 80, num_ranks=1), "gathered parameters").bytes == (
        2 * (root + 2 * layer))


def test_what_the_plan_used_to_miss_is_counted():
    args = KNOWN_SHAPES["Qwen2.5-7B"]
    total, root, layer = parameter_counts(args)
    config = load_config("configs/countdown_qwen2.5_7b_8gpu.toml")
    plan = plan_memory(config, args, 80, num_ranks=8)
    # FSDP2 holds every gradient unsharded in fp32 between an update's micro-batches
    assert _term(plan, "accumulated gradients").bytes == 4 * total
    per_micro = load_config("configs/countdown_qwen2.5_7b_8gpu.toml",
                            ['train.gradient_sync="micro_batch"'])
    assert "accumulated gradients" not in {
        t.name for t in plan_memory(per_micro, args, 80, num_ranks=8).terms}
    # the root unit's reduce-scatter: its fp32 buffer is 4 B per parameter (4.4 GB at 7B)
    assert 4 * root / 1e9 == pytest.approx(4.36, abs=0.01)
    end = (2 + 4 + 4 / 8) * root - _term(plan, "activations").bytes
    assert _term(plan, "backward working set").bytes >= end
    small = load_config("configs/countdown_qwen2.5_7b_8gpu.toml",
                        ["batch.max_tokens_per_microbatch=1024"])
    working = _term(plan_memory(small, args, 80, num_ranks=8), "backward working set")
    assert "reduce-scatter at the end" in working.detail  # the largest moment at 1k tokens


def test_asynchronous_collection_keeps_snapshots_and_the_kv_cache_resident():
    args = KNOWN_SHAPES["Qwen2.5-1.5B"]
    total = parameter_counts(args)[0]
    sync = plan_memory(load_config("configs/quickstart.toml"), args, 24)
    assert "weight snapshots" not in {t.name for t in sync.terms}
    assert _term(sync, "engine KV cache").phase == "generation"
    ahead = load_config("configs/quickstart.toml", ["rollout.max_staleness=1"])
    plan = plan_memory(ahead, args, 24)
    snapshots = _term(plan, "weight snapshots")
    assert snapshots.bytes == 2 * 2 * total and snapshots.phase == "always"
    assert _term(plan, "engine KV cache").phase == "always"  # it generates while training
    assert plan.total_bytes - sync.total_bytes >= snapshots.bytes
    process = load_config("configs/quickstart.toml",
                          ["rollout.max_staleness=1", 'rollout.collector="process"'])
    assert "weight snapshots" not in {t.name for t in plan_memory(process, args, 24).terms}


def test_one_rank_accumulates_unsharded_gradients_too_unless_told_otherwise():
    config = load_config(GSM8K)
    args = model_shape(config.model.path)
    total = parameter_counts(args)[0]
    for ranks in (1, 2):  # one rank defers its (local) reduce to the last micro-batch too
        plan = plan_memory(config, args, 80, num_ranks=ranks)
        assert _term(plan, "accumulated gradients").bytes == 4 * total
    per_micro = load_config(GSM8K, ['train.gradient_sync="micro_batch"'])
    assert "accumulated gradients" not in {t.name for t in plan_memory(per_micro, args, 80).terms}


LORA_7B = "configs/countdown_qwen2.5_7b_lora_1gpu.toml"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_lora_per_token_bytes_match_the_measurement_within_15_percent(dtype, checkpointing,
                                                                      dropout):
    from agentrl.config import LoRAConfig
    from agentrl.memory.activations import lora_bytes_per_token
    from agentrl.model.lora import add_adapters, initial_adapter_state

    args, lora = _small("qwen2"), LoRAConfig(rank=8, dropout=dropout)
    model = build_model(args, dtype)
    add_adapters(model, lora)
    model.load_state_dict(initial_adapter_state(args, lora, 0), strict=False)
    model.to(dtype).configure_memory(checkpointing, logprob_chunk_tokens=64)
    measured = saved_bytes(model, synthetic_micro_batch(args.vocab_size, 256, 3),
                           chunked_head=True).total(args.num_hidden_layers)
    planned = (saved_bytes_per_token(args, dtype.itemsize, checkpointing, fp32_attention=True)
               + lora_bytes_per_token(args, lora, dtype.itemsize, checkpointing))
    assert abs(planned - measured) <= 0.15 * measured, (planned, measured)


def test_the_7b_lora_recipe_fits_one_80_gib_gpu_where_full_training_does_not():
    from agentrl.memory.fit import describe_fit, with_lora
    from agentrl.model.lora import count_adapter_parameters

    config = load_config(LORA_7B)
    args = model_shape(config.model.path)
    plan = plan_memory(config, args, 80, num_ranks=1)
    assert plan.fits and config.model.lora is not None
    terms = {t.name: t.bytes for t in plan.terms}
    total = parameter_counts(args)[0]
    adapters = count_adapter_parameters(args, config.model.lora)
    assert terms["frozen base"] == 2 * total  # bf16, no gradient, no AdamW state
    assert terms["adapters"] == 16 * adapters and adapters < 0.011 * total
    assert "model states" not in terms
    full = plan_memory(with_lora(config, None), args, 80, num_ranks=1)
    assert not full.fits and any("[model.lora]" in s for s in full.suggestions)
    assert full.total_bytes - plan.total_bytes > 90 * GIB
    text = describe_fit(config, args, 80, 1)
    assert "Qwen2.5-7B" in text and "Qwen2.5-32B     " in text and "largest rank" in text


def test_plan_command_prints_lora_terms(capsys):
    assert main(["plan", LORA_7B, "--gpu-memory", "80"]) == 2  # /models is not here
    out = capsys.readouterr().out
    assert "frozen base" in out and "adapters" in out and "fits;" in out
    assert "known models with these settings" in out


def test_lora_counts_only_adapters_in_the_gradient_and_snapshot_terms():
    from agentrl.model.lora import count_adapter_parameters

    args = KNOWN_SHAPES["Qwen2.5-1.5B"]
    total = parameter_counts(args)[0]
    full = load_config("configs/quickstart.toml", ["rollout.max_staleness=1"])
    lora = load_config("configs/quickstart.toml", ["rollout.max_staleness=1",
                                                   "model.lora.rank=8"])
    adapters = count_adapter_parameters(args, lora.model.lora)
    full_plan, plan = plan_memory(full, args, 24, num_ranks=2), plan_memory(lora, args, 24,
                                                                            num_ranks=2)
    # only the adapters have gradients to accumulate and go to the collector
    assert _term(full_plan, "accumulated gradients").bytes == 4 * total
    assert _term(plan, "accumulated gradients").bytes == 4 * adapters
    assert _term(full_plan, "weight snapshots").bytes == 2 * 2 * total
    assert _term(plan, "weight snapshots").bytes == 2 * 2 * adapters
    assert _term(plan, "engine KV cache").phase == "always"  # asynchronous, as without LoRA
    # the frozen root has no gradient: no head gradient, no reduce-scatter at the end
    seven_b, eight = KNOWN_SHAPES["Qwen2.5-7B"], ["batch.max_tokens_per_microbatch=1024"]
    for lora_rank, expected in ((None, True), (8, False)):
        overrides = eight + ([] if lora_rank is None else [f"model.lora.rank={lora_rank}"])
        config = load_config("configs/countdown_qwen2.5_7b_8gpu.toml", overrides)
        working = _term(plan_memory(config, seven_b, 80, num_ranks=8), "backward working set")
        assert ("reduce-scatter at the end" in working.detail) == expected
    head = load_config("configs/quickstart.toml", eight)
    assert "head's fp32 gradient" in _term(plan_memory(head, args, 24),
                                           "backward working set").detail
    with_lora = load_config("configs/quickstart.toml", [*eight, "model.lora.rank=8"])
    assert "head's fp32 gradient" not in _term(plan_memory(with_lora, args, 24),
                                               "backward working set").detail


def test_the_root_units_reduce_scatter_by_hand():
    # Qwen2.5-7B, bf16, 8 ranks, 1,024 tokens, checkpointing on: the largest moment of
    # backward is FSDP2's reduce-scatter of the root unit (embeddings + untied head +
    # final norm): its bf16 gradient (2 B), the fp32 copy-in buffer (4 B) and the 1/8
    # fp32 output (0.5 B) per parameter, once the activations are freed
    config = load_config("configs/countdown_qwen2.5_7b_8gpu.toml",
                         ["batch.max_tokens_per_microbatch=1024"])
    plan = plan_memory(config, KNOWN_SHAPES["Qwen2.5-7B"], 80, num_ranks=8)
    root = 2 * 152064 * 3584 + 3584  # 1,089,998,336 parameters
    # per token: 28 checkpointed layers × 2·3584, rope 2·2·128, head 8 + (4·3584 + 8 +
    # 2·2·3584) + 8 + 4 + 40
    per_token = 28 * 7168 + 512 + 8 + (14336 + 8 + 14336) + 8 + 4 + 40
    assert per_token == 229_956
    assert _term(plan, "activations").bytes == 1024 * per_token
    working = _term(plan, "backward working set")
    assert working.bytes == 6.5 * root - 1024 * per_token == 6_849_514_240
    assert "reduce-scatter at the end" in working.detail
