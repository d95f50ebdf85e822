"""The check every model-family test makes: each row holds exactly the tokens the engine
saw (its prompts and its generations), and every generated token came from the engine."""

from __future__ import annotations

from typing import Any


def assert_rows_hold_engine_tokens(segments: list[Any], prompts: list[list[int]],
                                   generations: list[Any]) -> list[int]:
    """Each engine call (prompt, generation) extends one row, rows in order, the
    generation marked trained; every trained token of a row is one of its calls'.
    Returns the number of calls per row."""
    calls = list(zip(prompts, generations, strict=True))
    per_row: list[int] = []
    index = 0
    for segment in segments:
        trained: list[int] = []
        count = 0
        while index < len(calls):
            prompt, generation = calls[index]
            ids = list(generation.token_ids)
            end = len(prompt) + len(ids)
            if segment.token_ids[:end] != [*prompt, *ids]:
                break
            assert all(segment.loss_mask[len(prompt):end]), "a generation is not trained"
            trained += ids
            count += 1
            index += 1
        generated = [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]
        assert generated == trained, "a row trains tokens the engine did not generate"
        assert count, "a row holds no engine call"
        per_row.append(count)
    assert index == len(calls), f"engine calls {index}.. are in no row"
    return per_row
