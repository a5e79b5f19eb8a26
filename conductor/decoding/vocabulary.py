"""A model's vocabulary as the grammar engine sees it: llguidance's tokenizer, the end tokens, the choice positions.

WHY here and not in a backend: the transformers backend masks with it while sampling, and the GRPO trainer
needs the same view afterwards to tell which completion tokens the grammar forced (``choice_positions``).
"""

from __future__ import annotations

from typing import Any


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """End-of-turn ids: the generation config's, the tokenizer's, and ChatML's ``<|im_end|>``."""
    ids: set[int] = set()
    cfg = getattr(model, "generation_config", None)
    eos = getattr(cfg, "eos_token_id", None)
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None:
        ids.add(im_end)
    return ids


def output_size(model: Any) -> int:
    """Rows of the model's output layer: the logits' width, which may exceed the tokenizer's vocabulary."""
    return int(model.get_output_embeddings().weight.shape[0])


def llguidance_vocabulary(model: Any, tokenizer: Any, eos_ids: set[int]) -> Any:
    """llguidance's tokenizer for a model: its vocabulary at the output layer's size, its end tokens."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=output_size(model), eos_token=sorted(eos_ids))


def compile_gbnf(grammar: str, lltok: Any) -> str:
    """llguidance's form of a GBNF grammar, checked against the vocabulary; a ValueError saying why not."""
    import llguidance

    try:
        compiled = llguidance.grammar_from("gbnf", grammar)
    except ValueError as e:
        raise ValueError(f"the grammar does not convert: {e}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, lltok)
    if is_error:
        raise ValueError(f"invalid grammar: {messages[0] if messages else '?'}")
    return compiled


def choice_positions(lltok: Any, grammar: str, token_ids: list[int]) -> list[bool]:
    """For each token of a completion decoded under ``grammar``: did the grammar leave a choice there?

    WHY: under a workflow grammar most of a completion is forced (the rest of a vocabulary subtask once its
    first token is out, brackets, quotes, the end token): the constrained policy puts probability 1 on those
    tokens whatever the weights, so they carry no decision and no policy gradient. Training on them anyway
    spends most of a token-weighted loss (and the KL and entropy figures) on tokens that never change a
    workflow. A position counts as a choice when the grammar allowed more than one token; tokens after one
    the grammar rejects (not decoded under it) all count as choices.
    """
    import llguidance
    import numpy as np

    matcher = llguidance.LLMatcher(lltok, llguidance.grammar_from("gbnf", grammar), log_level=0)
    out: list[bool] = []
    for i, t in enumerate(token_ids):
        if matcher.is_stopped():
            out.append(False)                    # past a complete workflow only the end token may follow
            continue
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        out.append(int(bits.sum()) > 1)
        if not matcher.consume_token(int(t)):
            return out + [True] * (len(token_ids) - i - 1)
    return out
