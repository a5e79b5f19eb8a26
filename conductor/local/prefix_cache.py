"""Saved llama.cpp KV states of long prompt prefixes, in memory and on disk.

WHY: every conductor prompt starts with the same ~900 tokens of instructions and examples, in one order per
question domain (prompts.same_domain_first), and only the question differs. llama.cpp keeps the KV cache of
the previous prompt, so consecutive questions of one domain re-read only the question; but a switch of
domain re-read ~700 tokens (about 15 s on one CPU thread here) and every new run re-read the whole prefix.
A prefix state is the KV cache of sequence 0 (``llama_state_seq_get_data``: K and V per layer, no logits,
~28 KB per token for Qwen2.5-1.5B), so restoring one costs a memory copy. States are kept in memory for the
run and written to ``$CONDUCTOR_HOME/prefix-cache/<model>/`` for the next run (atomically, the newest
``max_files`` kept). They are valid only for the model file they were computed with: the directory is keyed
on its name and size, and a state that llama.cpp refuses to restore is deleted.

File format: ``CKV1``, uint32 token count, the tokens as int32, then the state bytes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

from conductor.files import atomic_path

MAGIC = b"CKV1"
MIN_SAVED_PREFIX = 256   # a prompt sharing fewer tokens than this with the previous one saves no state
MIN_GAIN = 64   # a prefix state is saved only when it covers this many tokens more than the best stored one


@dataclass(frozen=True)
class PrefixState:
    tokens: tuple[int, ...]
    data: bytes


def common_length(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    """Length of the longest common prefix.

    >>> common_length([1, 2, 3], (1, 2, 4, 5)), common_length([], [1]), common_length([7], [7])
    (2, 0, 1)
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """Prefix states of one model: ``best(ids)`` finds the stored prefix sharing the most tokens with ``ids``."""

    def __init__(self, directory: str | Path | None, max_files: int = 8, max_memory: int = 8):
        self.directory = Path(directory) if directory is not None else None
        self.max_files = max_files
        self.max_memory = max_memory
        self._memory: dict[tuple[int, ...], PrefixState] = {}
        self._disk: dict[tuple[int, ...], Path] | None = None     # tokens -> file, read lazily

    @classmethod
    def for_model(cls, root: str | Path, model_path: str | Path, **kw: int) -> PrefixCache:
        """The cache directory of one model file under ``root`` (keyed on the file's name and size)."""
        p = Path(model_path)
        key = hashlib.sha256(f"{p.name}:{p.stat().st_size}".encode()).hexdigest()[:16]
        return cls(Path(root) / f"{p.stem}-{key}", **kw)

    def _index(self) -> dict[tuple[int, ...], Path]:
        if self._disk is None:
            self._disk = {}
            if self.directory is not None and self.directory.is_dir():
                for f in self.directory.glob("*.kv"):
                    tokens = _read_tokens(f)
                    if tokens is not None:
                        self._disk[tokens] = f
        return self._disk

    def best(self, ids: list[int] | tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """(stored tokens, tokens they share with ``ids``) for the best stored prefix; ((), 0) when none."""
        best: tuple[tuple[int, ...], int] = ((), 0)
        for tokens in (*self._memory, *self._index()):
            n = common_length(tokens, ids)
            if n > best[1]:
                best = (tokens, n)
        return best

    def load(self, tokens: tuple[int, ...]) -> PrefixState | None:
        state = self._memory.get(tokens)
        if state is None and tokens in self._index():
            data = _read_state(self._index()[tokens])
            if data is not None:
                state = self._remember(PrefixState(tokens, data))
        return state

    def forget(self, tokens: tuple[int, ...]) -> None:
        """Drop a state llama.cpp refused (another build or model): from memory and disk."""
        self._memory.pop(tokens, None)
        f = self._index().pop(tokens, None)
        if f is not None:
            f.unlink(missing_ok=True)

    def put(self, state: PrefixState) -> None:
        self._remember(state)
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(struct.pack(f"<{len(state.tokens)}i", *state.tokens)).hexdigest()[:24] + ".kv"
        with atomic_path(self.directory / name, suffix=".part") as tmp, open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(state.tokens)))
            f.write(struct.pack(f"<{len(state.tokens)}i", *state.tokens))
            f.write(state.data)
        self._index()[state.tokens] = self.directory / name
        files = sorted(self.directory.glob("*.kv"), key=lambda f: f.stat().st_mtime, reverse=True)
        for old in files[self.max_files:]:
            for tokens in [t for t, f in self._index().items() if f == old]:
                del self._index()[tokens]
            old.unlink(missing_ok=True)

    def _remember(self, state: PrefixState) -> PrefixState:
        self._memory[state.tokens] = state
        while len(self._memory) > self.max_memory:
            self._memory.pop(next(iter(self._memory)))
        return state


def _read_tokens(f: Path) -> tuple[int, ...] | None:
    try:
        with f.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8 or head[:4] != MAGIC:
                return None
            (n,) = struct.unpack("<I", head[4:])
            raw = fh.read(4 * n)
            return tuple(struct.unpack(f"<{n}i", raw)) if len(raw) == 4 * n else None
    except OSError:
        return None


def _read_state(f: Path) -> bytes | None:
    try:
        blob = f.read_bytes()
    except OSError:
        return None
    (n,) = struct.unpack("<I", blob[4:8])
    return blob[8 + 4 * n:] or None
