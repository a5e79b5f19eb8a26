"""Check a run's inputs before anything starts: one plain function the CLI calls before Prefect starts (and
hands its result over to the flow it starts), so a mistake is one ``error:`` line at once, never a traceback
after minutes of work.

``prepare_answer`` checks an ``AnswerConfig`` and resolves everything an answer run needs (questions, pool,
conductor checkpoint, few-shot policy, sub-pool size, run id, output, lake and cache paths) and the key of
the settings that change answers (``AnswerConfig.settings_key``); ``RunSpec.settings_key`` folds that key
into every trajectory id, which is what makes a rerun resume by content.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.files import atomic_write_text

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.execution.shared_limits import LimitsSpec
    from conductor.policy.spec import AutoSpec, ChampionSpec, ConductorSpec
    from conductor.prompts import FewShotSpec
    from conductor.run.config import AnswerConfig
    from conductor.workers.pool import Pool


class UsageError(ValueError):
    """Bad input to a command: the message is one line naming the option, file or field."""


@dataclass(frozen=True)
class AnswerInputs:
    """What an answer run works from, every part checked."""

    config: AnswerConfig   # resolved: run id, lake, cache, few-shot policy, temperature and grammar filled in
    questions: list[Question]
    pool: Pool
    checkpoint: str
    settings_key: str
    out: Path


def first_line(e: BaseException) -> str:
    """An exception as one redacted line (its type when it has no message)."""
    from conductor.workers.secrets import redact

    text = str(e).strip()
    return redact(text.splitlines()[0] if text else type(e).__name__)


_HANDED_OVER: dict[str, AnswerInputs] = {}   # at most one: prepared by the CLI, taken by its flow


def prepare_answer(config: AnswerConfig, hand_over: bool = False) -> AnswerInputs:
    """Every check an answer run needs, cheapest first; UsageError (one line) on the first mistake.

    WHY ``hand_over``: the CLI prepares a run before Prefect starts (a mistake is one ``error:`` line, not a
    traceback) and then starts the flow with the resolved configuration (``AnswerInputs.config``), which
    prepares it again. With ``hand_over`` the inputs are kept for that one call, so the question set is read,
    the pool loaded and the champion looked up once per run; any other call prepares afresh (a rerun sees an
    edited question file).
    """
    key = config.model_dump_json()
    held = _HANDED_OVER.pop(key, None)
    if held is not None:
        return held
    inputs = _prepare(config)
    if hand_over:
        _HANDED_OVER.clear()
        _HANDED_OVER[inputs.config.model_dump_json()] = inputs
    return inputs


def _prepare(config: AnswerConfig) -> AnswerInputs:
    c = config
    check_numbers(samples=c.samples, recursion_depth=c.recursion_depth, limit=c.limit, shard_size=c.shard_size,
                  temperature=0.0 if c.temperature is None else c.temperature, max_tokens=c.max_tokens,
                  max_steps=c.max_steps)
    if c.fewshot.policy != "auto":
        check_fewshot(c.fewshot)
    if c.run_id is not None:
        check_run_id(c.run_id)
    check_limits(c.limits)
    manifest = check_pool(c.pool)
    check_k(c.k, manifest, c.conductor)
    checkpoint = check_conductor(c.conductor, manifest, c.max_steps)
    qs = check_questions(c.questions, c.limit)
    out_dir = Path(c.out)
    lake, cache = check_outputs(out_dir, c.lake, c.cache)
    from conductor.policy.spec import is_embedded_checkpoint
    embedded = is_embedded_checkpoint(checkpoint)
    resolved = c.model_copy(update={
        "lake": lake, "cache": cache,
        # the untrained embedded conductor writes prose too often without the grammar
        "constrained": embedded if c.constrained is None else c.constrained,
        # the informed prompt for the untrained embedded conductor
        "fewshot": c.fewshot.resolved(embedded),
        # an untrained 1.5B samples garbled workflows at 0.7 (measured); its greedy one is its best
        "temperature": (0.0 if embedded else 0.7) if c.temperature is None else c.temperature})
    key = resolved.settings_key(manifest, checkpoint)
    resolved = resolved.model_copy(update={"run_id": c.run_id or resolved.derive_run_id(key)})
    return AnswerInputs(config=resolved, questions=qs, pool=manifest, checkpoint=checkpoint, settings_key=key,
                        out=out_dir)


def check_outputs(out_dir: Path, lake: str | None, cache: str | None) -> tuple[str, str]:
    """(lake, cache) of a run writing into ``out_dir``, each checked writable; the defaults live under it."""
    check_writable_dir(out_dir, "--out")
    lake = lake or str(out_dir / "lake")
    if "://" not in lake or lake.startswith("file://"):
        check_writable_dir(Path(lake.removeprefix("file://")), "--lake")
    for name in ("answers.jsonl", "summary.json"):   # found now, not after all the work
        if (out_dir / name).is_dir():
            raise UsageError(f"--out {out_dir}: {out_dir / name} is a directory, expected a file")
    if (out_dir / "report").exists() and not (out_dir / "report").is_dir():
        raise UsageError(f"--out {out_dir}: {out_dir / 'report'} exists and is not a directory")
    cache = cache or str(out_dir / "cache.sqlite")
    check_file_path(Path(cache), "--cache")
    check_cache_file(Path(cache))
    return lake, cache


def check_limits(limits: LimitsSpec | None) -> None:
    """A ``sqlite:`` store's directory must exist (never a tree of directories made under a mistyped path)."""
    path = limits.path if limits is not None else None
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"--limits {limits}: {path} is a directory, expected a file")
    if not path.parent.is_dir():
        raise UsageError(f"--limits {limits}: directory {path.parent} does not exist")


MAX_TEMPERATURE = 2.0   # the providers' own range (OpenAI: 0-2; Anthropic: 0-1); 1000 is a typo
OUT_MARKER = ".conductor-run.json"
OUT_LOCK = ".conductor.lock"


def claim_out(out: Path, questions: str, replace: bool = False) -> Any:
    """Take ``out`` for this run: a lock held until the process ends (two identical runs on one ``--out``
    would both pay for every call) and a marker naming the question set, so a used ``--out`` that holds
    another input's answers is refused (its answers.jsonl, summary.json and report/ would be replaced)
    unless ``replace``. Returns the open lock file (keep it open for the run)."""
    import fcntl
    import json

    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / OUT_LOCK, "a+")   # noqa: SIM115 - held for the life of the run
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise UsageError(f"--out {out}: another `conductor answer` is writing there now; wait for it to end "
                         "(a rerun of the same command then resumes from the lake)") from None
    marker = out / OUT_MARKER
    try:
        before = json.loads(marker.read_text(encoding="utf-8")).get("questions") if marker.exists() else None
    except (OSError, ValueError, AttributeError):
        before = None
    if before is not None and before != questions.strip() and not replace and (out / "answers.jsonl").exists():
        fh.close()
        raise UsageError(f"--out {out}: holds the answers of another question set ({before!r}); use a new "
                         "--out, or --replace to overwrite its answers.jsonl, summary.json and report/")
    atomic_write_text(marker, json.dumps({"questions": questions.strip()}) + "\n")
    return fh


def check_cache_file(path: Path) -> None:
    """An existing ``--cache`` is an SQLite database (a garbage file is found now, not after Prefect starts)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head != b"SQLite format 3\x00":
        raise UsageError(f"--cache {path}: not an SQLite database (give a new path or remove the file)")


def check_numbers(**values: Any) -> None:
    """Counts are positive integers (recursion depth may be 0); temperatures are finite and not negative."""
    for name, v in values.items():
        if v is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "temperature":
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_TEMPERATURE:
                raise UsageError(f"{flag} must be a number between 0 and {MAX_TEMPERATURE:g}, not {v!r}")
            continue
        low = 0 if name == "recursion_depth" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise UsageError(f"{flag} must be an integer >= {low}, not {v!r}")


def check_fewshot(fewshot: FewShotSpec | str) -> None:
    """The examples of a few-shot setting can be read (its syntax was checked where the configuration was read)."""
    from conductor.prompts import select_fewshot

    try:
        select_fewshot(fewshot)
    except (ValueError, OSError, KeyError) as e:
        raise UsageError(f"--fewshot {str(fewshot)!r}: {first_line(e)}") from None


def check_run_id(run_id: str) -> None:
    from conductor.lake.storage import check_key

    try:
        check_key("--run-id", run_id)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_pool(path: str | os.PathLike[str]) -> Pool:
    """Load a manifest and check each worker's provider options (a simulated skill of 7.5 is a mistake)."""
    from conductor.workers.pool import PoolError, load_pool

    try:
        manifest = load_pool(path)
    except PoolError as e:
        raise UsageError(str(e)) from None
    check_worker_options(manifest, str(path))
    return manifest


def check_worker_options(manifest: Pool, source: str = "<pool>") -> None:
    """Provider-specific ``options`` are validated by their provider; check them before any call."""
    from pydantic import BaseModel, ValidationError

    from conductor.workers.providers.replay import ReplayOptions
    from conductor.workers.providers.simulated import SimulatedOptions

    validators: dict[str, type[BaseModel]] = {"simulated": SimulatedOptions, "replay": ReplayOptions}
    for i, w in enumerate(manifest.workers):
        if w.provider not in validators:
            continue
        try:
            validators[w.provider].model_validate(w.options)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise UsageError(f"{source}: workers[{i}] ({w.name}).options.{where}: {err['msg']}") from None


def check_k(k: int | None, manifest: Pool, conductor: ConductorSpec) -> None:
    if k is None:
        return
    from conductor.policy.strategies import is_strategy

    n = len(manifest.workers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise UsageError(f"--k {k}: must be between 1 and the pool's {n} workers")
    from conductor.policy.spec import MenuSpec

    if is_strategy(conductor) or isinstance(conductor, MenuSpec):   # their workflows name the whole pool's ordinals
        raise UsageError(f"--k {k}: {'a menu' if isinstance(conductor, MenuSpec) else 'strategy'} "
                         f"{str(conductor)!r} runs over the whole pool; drop --k")


def check_conductor(spec: ConductorSpec, manifest: Pool, max_steps: int, flag: str = "--conductor") -> str:
    """The checkpoint id a conductor spec stands for, or UsageError: strategies are checked against the pool,
    ``champion`` needs a promoted champion, model specs need their files, packages and key variables."""
    from conductor.learning.registry import RegistryError
    from conductor.policy.factory import check_spec
    from conductor.policy.spec import (
        AutoSpec,
        ChampionSpec,
        ConductorSpecError,
        EmbeddedSpec,
        MenuSpec,
        StrategyBase,
    )
    from conductor.policy.strategies import check_strategy
    from conductor.run.runtime import checkpoint_of

    try:
        match spec:
            case StrategyBase():
                check_strategy(spec, manifest, max_steps)
            case MenuSpec(entries=entries):
                for entry in entries:
                    check_strategy(entry, manifest, max_steps)
                check_spec(EmbeddedSpec())
            case AutoSpec() | ChampionSpec():
                _check_champion(spec)
            case _:
                check_spec(spec)
        return checkpoint_of(spec, manifest)
    except (ConductorSpecError, RegistryError, OSError) as e:
        raise UsageError(f"{flag}: {first_line(e)}") from None


def _check_champion(spec: AutoSpec | ChampionSpec) -> None:
    """``champion`` needs a registry with a champion whose files are there; ``auto`` one that can be read."""
    import fsspec

    from conductor.learning.registry import Registry, RegistryError
    from conductor.policy.spec import AutoSpec
    from conductor.run.runtime import registry_of

    auto = isinstance(spec, AutoSpec)
    uri = registry_of(spec)
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        if auto:
            return
        raise RegistryError(f"registry {uri} does not exist, so it has no champion")
    if fs.isfile(path):
        raise RegistryError(f"registry {uri} is a file, not a registry directory")
    champion = Registry.open(uri).champion
    if champion is None and not auto:
        raise RegistryError(f"registry {uri}: no champion has been promoted yet")
    if champion is not None:   # its files must still be there (found now, not after Prefect starts)
        from conductor.learning.registry import check_checkpoint_dir

        try:
            check_checkpoint_dir(champion.uri)
        except RegistryError as e:
            raise RegistryError(f"registry {uri}: champion {champion.checkpoint_id}: {e}") from None


def check_questions(spec: str, limit: int | None) -> list[Question]:
    from conductor.data.datasets import DatasetError
    from conductor.data.questionset import load_questions

    try:
        qs = load_questions(spec, limit)
    except (DatasetError, ValueError, OSError) as e:
        raise UsageError(first_line(e)) from None
    if not qs:
        raise UsageError(f"{spec}: no questions to answer")
    return qs


def check_writable_dir(path: Path, flag: str) -> None:
    """``path`` is (or can be created as) a directory this process can write into; nothing is created."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a directory")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag} {path}: {probe} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe, prefix=".conductor-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write in {probe} ({e.strerror or e})") from None


def check_file_path(path: Path, flag: str) -> None:
    """A file this process may create or update."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, expected a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: not writable")
    check_writable_dir(path.parent, flag)
