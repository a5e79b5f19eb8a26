"""A vocabulary of the 256 bytes plus an end token, for llguidance in tests: any text is a token sequence, one
byte a token, so acceptance can be asked of any string (tests/test_grammar_contract.py, test_decoding_mask.py)."""

from __future__ import annotations

EOS = 256


class ByteVocab:
    """What ``llguidance.TokenizerWrapper`` reads of a tokenizer."""

    eos_token_id, bos_token_id, special_token_ids = EOS, None, [EOS]
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]

    def __call__(self, s: bytes) -> list[int]:
        return list(s)
