"""Batched grammar masks (conductor.decoding.mask): for every row the scores left finite are exactly the tokens
llguidance's own per-row mask allows, rows that finished a workflow may only end, and logits wider than the
grammar's vocabulary never reach the extra ids. Real llguidance matchers over a byte vocabulary."""

from __future__ import annotations

import pytest

from conductor.decoding.grammar import WorkflowGrammar
from conductor.decoding.mask import _pack
from tests.byte_vocab import EOS, ByteVocab

torch = pytest.importorskip("torch")
llguidance = pytest.importorskip("llguidance")


def _allowed(matcher) -> set[int]:
    bits = int.from_bytes(matcher.compute_bitmask(), "little")
    return {i for i in range(EOS + 1) if bits >> i & 1}


def test_batched_mask_matches_each_rows_own_mask_and_finished_rows_only_end():
    from conductor.decoding.mask import GrammarLogitsProcessor

    lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocab()))
    gbnf = WorkflowGrammar(3, 1, plan_chars=0, subtask_chars=4).gbnf()
    proc = GrammarLogitsProcessor(lltok, gbnf, {EOS})
    texts = [b'model_id = [2]\nsubtasks = ["ab', b"model_id = [", b'model_id = [0]\nsubtasks = ["x"]\naccess_list = [[]]']
    width = EOS + 1 + 7                                    # the model's output layer is wider than the vocabulary
    refs = [llguidance.LLMatcher(lltok, llguidance.grammar_from("gbnf", gbnf), log_level=0) for _ in texts]
    out = proc(torch.zeros((3, 1), dtype=torch.long), torch.zeros((3, width)))     # the first call: no token yet
    assert [set(torch.isfinite(r).nonzero().flatten().tolist()) for r in out] == [_allowed(m) for m in refs]
    for step in range(max(map(len, texts)) + 24):          # past its text, a row takes its first allowed token
        tokens = [t[step] if step < len(t) else EOS if m.is_stopped() else min(_allowed(m)) for t, m in zip(texts, refs)]
        for m, t in zip(refs, tokens):
            if not m.is_stopped():
                assert m.consume_token(t)
        out = proc(torch.tensor(tokens)[:, None], torch.zeros((3, width)))
        for row, m in zip(out, refs):
            assert set(torch.isfinite(row).nonzero().flatten().tolist()) == ({EOS} if m.is_stopped() else _allowed(m))
    assert not proc.errors and all(m.is_stopped() for m in refs)
    assert torch.isinf(out[:, EOS + 1:]).all()


def test_pack_is_llguidances_bit_order():
    v = torch.zeros(96, dtype=torch.bool)
    v[[0, 31, 32, 95]] = True
    assert _pack(v).tolist() == [1 - 2**31, 1, -(2**31)]        # ids 0 and 31; 32; 95
