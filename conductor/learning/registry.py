"""Checkpoint registry: which checkpoint is the champion, which is the challenger, and why.

Follows the MLflow convention of named aliases (``champion``, ``challenger``)
pointing at registered checkpoints. An alias swap and the history event that
explains it are written together in one atomic operation, so readers never see
a champion without its reason. Promotion is a policy decision over an
``EvalReport``: promote only when the candidate is significantly better overall
and no domain regresses beyond a tolerance; otherwise it becomes the challenger,
with the reason recorded. ``rollback`` returns to the previous champion.

Backends: ``FileBackend`` (default: one JSON document under a local or
``s3://`` root; local writes are temp-file + rename under a lock, s3 writes are a
single PUT) and ``MlflowBackend`` (an MLflow model registry: versions, aliases via
``set_registered_model_alias``, history as registered-model tags).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from conductor.files import atomic_write_bytes

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

    from conductor.learning.evaluation import EvalReport

CHAMPION = "champion"
CHALLENGER = "challenger"


class _Unchecked(enum.Enum):
    ANY = "any"


ANY = _Unchecked.ANY   # swap(expect=ANY): no compare-and-swap check
Expect = str | None | Literal[_Unchecked.ANY]   # the alias's target a swap expects (None: unset), or ANY


class RegistryError(ValueError):
    """A registry operation that cannot be done; one line naming what and why."""


@dataclass(frozen=True)
class CheckpointEntry:
    checkpoint_id: str
    uri: str
    created_at: str
    lineage: dict[str, Any] = field(default_factory=dict)
    mlflow_version: str | None = None


@dataclass(frozen=True)
class PromotionPolicy:
    """When a candidate may replace the champion."""

    alpha: float = 0.05                       # significance level of the overall paired test
    test: Literal["bootstrap", "mcnemar", "both"] = "bootstrap"
    max_domain_regression: float = 0.02       # no domain may drop by more than this (absolute)
    min_improvement: float = 0.0              # overall diff must exceed this
    min_questions: int = 1


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    candidate_id: str
    champion_id: str | None
    p_value: float | None = None
    diff: float | None = None
    regressions: dict[str, float] = field(default_factory=dict)


def decide(report: EvalReport, policy: PromotionPolicy, candidate_id: str = "",
           champion_id: str | None = None) -> Decision:
    """The promotion rule as a pure function of the report and the policy."""
    p = report.p_value(policy.test)
    regressions = {d: round(dc.diff, 6) for d, dc in report.domains.items() if dc.diff < -policy.max_domain_regression}

    def verdict(promote: bool, reason: str) -> Decision:
        return Decision(promote, reason, candidate_id, champion_id, p_value=p, diff=report.diff, regressions=regressions)

    if report.bootstrap.n_questions < policy.min_questions:
        return verdict(False, f"too few paired questions ({report.bootstrap.n_questions} < {policy.min_questions})")
    if report.diff <= policy.min_improvement:
        return verdict(False, f"not better overall: {report.metric} diff {report.diff:+.4f} <= {policy.min_improvement}")
    if not p < policy.alpha:
        return verdict(False, f"not significant: {policy.test} p={p:.4g} >= alpha={policy.alpha}")
    if regressions:
        worst = ", ".join(f"{d} {v:+.4f}" for d, v in sorted(regressions.items()))
        return verdict(False, f"domain regression beyond {policy.max_domain_regression}: {worst}")
    return verdict(True, f"better overall: {report.metric} diff {report.diff:+.4f}, {policy.test} p={p:.4g} < {policy.alpha}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ------------------------------------------------------------------ backends

class RegistryBackend(Protocol):
    def add_checkpoint(self, entry: CheckpointEntry) -> CheckpointEntry: ...
    def checkpoints(self) -> dict[str, CheckpointEntry]: ...
    def aliases(self) -> dict[str, str]: ...
    def history(self) -> list[dict[str, Any]]: ...
    def swap(self, alias: str, checkpoint_id: str | None, event: dict[str, Any], expect: Expect = ANY) -> str | None:
        """Point ``alias`` at ``checkpoint_id`` (None removes it) and record ``event`` with its ``previous``
        target, atomically; refuse if ``expect`` is given and the alias no longer points there. Returns previous."""
        ...


class FileBackend:
    """One JSON document ``<root>/registry.json``; root is a local path or any fsspec URL (s3://...)."""

    FILE = "registry.json"

    def __init__(self, root: str):
        import fsspec

        self.root = root.rstrip("/")
        self.fs, self._path = fsspec.core.url_to_fs(f"{self.root}/{self.FILE}")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if self.local:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)

    # -- raw document
    def _read(self) -> dict[str, Any]:
        try:
            with self.fs.open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {"format": 1, "revision": 0, "checkpoints": {}, "aliases": {}, "history": []}
        except OSError as e:
            raise RegistryError(f"{self.root}/{self.FILE}: cannot read ({e})") from None
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise RegistryError(f"{self.root}/{self.FILE}: corrupt registry document ({e})") from None
        if not isinstance(doc, dict) or "checkpoints" not in doc:
            raise RegistryError(f"{self.root}/{self.FILE}: not a registry document")
        return doc

    def _write(self, doc: dict[str, Any]) -> None:
        doc["revision"] = int(doc.get("revision", 0)) + 1
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        if self.local:
            atomic_write_bytes(self._path, data)
        else:
            self.fs.pipe(self._path, data)      # one PUT: object stores replace whole objects atomically

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under an exclusive lock (local); object stores assume a single writer."""
        if not self.local:
            yield self._read()
            return
        import fcntl

        with open(os.path.join(os.path.dirname(self._path), ".registry.lock"), "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                yield self._read()
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)

    # -- backend interface
    def add_checkpoint(self, entry: CheckpointEntry) -> CheckpointEntry:
        with self._locked() as doc:
            if entry.checkpoint_id in doc["checkpoints"]:
                old = doc["checkpoints"][entry.checkpoint_id]
                if old["uri"] != entry.uri:
                    raise RegistryError(f"checkpoint {entry.checkpoint_id!r} already registered at {old['uri']}")
                return CheckpointEntry(**old)
            doc["checkpoints"][entry.checkpoint_id] = asdict(entry)
            doc["history"].append({"time": entry.created_at, "action": "register", "checkpoint_id": entry.checkpoint_id,
                                   "uri": entry.uri})
            self._write(doc)
        return entry

    def checkpoints(self) -> dict[str, CheckpointEntry]:
        return {k: CheckpointEntry(**v) for k, v in self._read()["checkpoints"].items()}

    def aliases(self) -> dict[str, str]:
        return dict(self._read()["aliases"])

    def history(self) -> list[dict[str, Any]]:
        return list(self._read()["history"])

    def swap(self, alias: str, checkpoint_id: str | None, event: dict[str, Any], expect: Expect = ANY) -> str | None:
        with self._locked() as doc:
            if checkpoint_id is not None and checkpoint_id not in doc["checkpoints"]:
                raise RegistryError(f"unknown checkpoint {checkpoint_id!r}")
            prev = doc["aliases"].get(alias)
            if expect is not ANY and prev != expect:
                raise RegistryError(f"alias {alias!r} changed concurrently: now {prev!r}, expected {expect!r}")
            if checkpoint_id is None:
                doc["aliases"].pop(alias, None)
            else:
                doc["aliases"][alias] = checkpoint_id
            doc["history"].append({**event, "previous": prev})
            self._write(doc)
        return prev


class MlflowBackend:
    """An MLflow model registry as the store: checkpoints are model versions (source = checkpoint URI),
    aliases are MLflow aliases, history events are registered-model tags ``conductor.event.NNNNNN``.

    The alias change is one MLflow call (atomic on the server); its event tag is written just after.
    """

    EVENT_TAG = "conductor.event."

    def __init__(self, tracking_uri: str, model_name: str = "conductor"):
        try:
            from mlflow import MlflowClient  # optional dependency: pip install 'conductor-orchestra[mlflow]'
            from mlflow.exceptions import MlflowException
        except ImportError:
            raise RegistryError("the MLflow registry backend needs mlflow: pip install 'conductor-orchestra[mlflow]'") from None
        if tracking_uri.startswith(("http://", "https://")):   # an unreachable server: seconds, not minutes of retries
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self.name = model_name
        self.root = f"{tracking_uri}#{model_name}"
        try:
            try:
                self.client.get_registered_model(model_name)
            except MlflowException as e:
                if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                    raise
                self.client.create_registered_model(model_name, description="Conductor checkpoints (conductor.learning.registry)")
        except Exception as e:   # unreachable server, bad URI, ...: one line, not a traceback
            raise RegistryError(f"MLflow registry {tracking_uri} ({model_name}): {str(e).splitlines()[0][:300]}") from None

    def _entry(self, mv: ModelVersion) -> CheckpointEntry:
        tags = mv.tags or {}
        lineage = json.loads(tags.get("conductor.lineage", "{}") or "{}")
        return CheckpointEntry(tags.get("conductor.checkpoint_id", f"v{mv.version}"), mv.source or "",
                               tags.get("conductor.created_at", ""), lineage, str(mv.version))

    def add_checkpoint(self, entry: CheckpointEntry) -> CheckpointEntry:
        existing = self.checkpoints().get(entry.checkpoint_id)
        if existing is not None:
            if existing.uri != entry.uri:
                raise RegistryError(f"checkpoint {entry.checkpoint_id!r} already registered at {existing.uri}")
            return existing
        lineage = json.dumps(entry.lineage, sort_keys=True, default=str)
        if len(lineage) > 4000:   # tag values are size-limited; keep the essentials
            lineage = json.dumps({k: entry.lineage.get(k) for k in ("parent", "rollout_run", "pool_id", "metrics")},
                                 default=str)[:4000]
        mv = self.client.create_model_version(self.name, source=entry.uri, tags={
            "conductor.checkpoint_id": entry.checkpoint_id, "conductor.created_at": entry.created_at,
            "conductor.lineage": lineage})
        self._event({"time": entry.created_at, "action": "register", "checkpoint_id": entry.checkpoint_id,
                     "uri": entry.uri})
        return CheckpointEntry(entry.checkpoint_id, entry.uri, entry.created_at, entry.lineage, str(mv.version))

    def checkpoints(self) -> dict[str, CheckpointEntry]:
        out = {}
        for mv in sorted(self.client.search_model_versions(f"name='{self.name}'"), key=lambda m: int(m.version)):
            e = self._entry(mv)
            out[e.checkpoint_id] = e
        return out

    def aliases(self) -> dict[str, str]:
        rm = self.client.get_registered_model(self.name)
        by_version = {e.mlflow_version: e.checkpoint_id for e in self.checkpoints().values()}
        return {a: by_version.get(str(v), f"v{v}") for a, v in (rm.aliases or {}).items()}

    def history(self) -> list[dict[str, Any]]:
        tags = self.client.get_registered_model(self.name).tags or {}
        return [json.loads(v) for k, v in sorted(tags.items()) if k.startswith(self.EVENT_TAG)]

    def _event(self, event: dict[str, Any]) -> None:
        tags = self.client.get_registered_model(self.name).tags or {}
        seq = sum(1 for k in tags if k.startswith(self.EVENT_TAG))
        self.client.set_registered_model_tag(self.name, f"{self.EVENT_TAG}{seq:06d}",
                                             json.dumps(event, sort_keys=True, default=str)[:4900])

    def swap(self, alias: str, checkpoint_id: str | None, event: dict[str, Any], expect: Expect = ANY) -> str | None:
        prev = self.aliases().get(alias)
        if expect is not ANY and prev != expect:
            raise RegistryError(f"alias {alias!r} changed concurrently: now {prev!r}, expected {expect!r}")
        if checkpoint_id is None:
            if prev is not None:
                self.client.delete_registered_model_alias(self.name, alias)
        else:
            entry = self.checkpoints().get(checkpoint_id)
            if entry is None:
                raise RegistryError(f"unknown checkpoint {checkpoint_id!r}")
            if entry.mlflow_version is None:
                raise RegistryError(f"checkpoint {checkpoint_id!r} has no MLflow model version")
            self.client.set_registered_model_alias(self.name, alias, entry.mlflow_version)
        self._event({**event, "previous": prev})
        return prev


# ------------------------------------------------------------------ the registry

class Registry:
    """Champion/challenger bookkeeping over a backend (file by default)."""

    def __init__(self, root: str | None = None, backend: RegistryBackend | None = None):
        if backend is None:
            if not root:
                raise RegistryError("registry: give a root directory/URL or a backend")
            backend = FileBackend(str(root))
        self.backend = backend

    @classmethod
    def open(cls, uri: str) -> Registry:
        """``mlflow+<tracking-uri>#<model>`` for MLflow (e.g. ``mlflow+sqlite:///m.db#conductor``), else a file root."""
        if uri.startswith("mlflow+"):
            tracking, _, model = uri.removeprefix("mlflow+").partition("#")
            return cls(backend=MlflowBackend(tracking, model or "conductor"))
        return cls(uri)

    # -- reading
    def get(self, checkpoint_id: str) -> CheckpointEntry:
        entries = self.backend.checkpoints()
        if checkpoint_id not in entries:
            raise RegistryError(f"unknown checkpoint {checkpoint_id!r} (registered: {', '.join(sorted(entries)) or 'none'})")
        return entries[checkpoint_id]

    def alias(self, name: str) -> CheckpointEntry | None:
        cid = self.backend.aliases().get(name)
        return None if cid is None else self.get(cid)

    @property
    def champion(self) -> CheckpointEntry | None:
        return self.alias(CHAMPION)

    def history(self) -> list[dict[str, Any]]:
        return self.backend.history()

    def show(self) -> dict[str, Any]:
        return {"aliases": self.backend.aliases(), "checkpoints": {k: asdict(v) for k, v in self.backend.checkpoints().items()},
                "history": self.history()}

    # -- writing
    def register(self, uri: str, lineage: dict[str, Any] | None = None, checkpoint_id: str | None = None) -> CheckpointEntry:
        """Add a checkpoint; its lineage is read from ``<uri>/lineage.json`` when not given."""
        if "://" not in uri:
            uri = os.path.abspath(uri)        # a relative path would mean something else to the next reader
        if lineage is None:
            lineage = read_lineage(uri)
        cid = checkpoint_id or lineage.get("checkpoint_id") or uri.rstrip("/").rsplit("/", 1)[-1]
        if not cid:
            raise RegistryError(f"cannot derive a checkpoint id from {uri!r}; pass checkpoint_id")
        if not isinstance(cid, str) or not _CHECKPOINT_ID.match(cid):
            raise RegistryError(f"checkpoint id {cid!r}: a plain name (letters, digits, '.', '_', '-', '+', '@', ':', "
                                "'='), never a path")
        return self.backend.add_checkpoint(CheckpointEntry(cid, uri, _now(), lineage))

    def promote(self, checkpoint_id: str, reason: str = "manual promotion", expect: Expect = ANY, **extra: Any) -> None:
        """Make ``checkpoint_id`` the champion (recording the previous one); ``expect`` = compare-and-swap."""
        self.get(checkpoint_id)
        if self.backend.aliases().get(CHAMPION) == checkpoint_id:
            raise RegistryError(f"{checkpoint_id!r} is already the champion")
        self.backend.swap(CHAMPION, checkpoint_id, {"time": _now(), "action": "promote", "alias": CHAMPION,
                                                    "checkpoint_id": checkpoint_id, "reason": reason, **extra},
                          expect=expect)
        if self.backend.aliases().get(CHALLENGER) == checkpoint_id:
            self.backend.swap(CHALLENGER, None, {"time": _now(), "action": "clear", "alias": CHALLENGER,
                                                 "checkpoint_id": None, "reason": "promoted to champion"},
                              expect=checkpoint_id)

    def set_challenger(self, checkpoint_id: str, reason: str, **extra: Any) -> None:
        self.get(checkpoint_id)
        self.backend.swap(CHALLENGER, checkpoint_id, {"time": _now(), "action": "challenger", "alias": CHALLENGER,
                                                      "checkpoint_id": checkpoint_id, "reason": reason, **extra})

    def promote_if_better(self, candidate_id: str, report: EvalReport | None,
                          policy: PromotionPolicy = PromotionPolicy()) -> Decision:
        """Promote when the report says so; otherwise record the candidate as challenger with the reason.

        With no champion yet, the first candidate becomes champion (there is nothing to beat).
        """
        self.get(candidate_id)
        champ = self.backend.aliases().get(CHAMPION)
        if champ is None:
            d = Decision(True, "first champion: no champion to compare with", candidate_id, None)
        elif report is None:
            raise RegistryError(f"candidate {candidate_id!r} needs an evaluation report against champion {champ!r}")
        else:
            if report.champion_id and report.champion_id != champ:
                raise RegistryError(f"report compares with {report.champion_id!r} but the champion is {champ!r}")
            d = decide(report, policy, candidate_id, champ)
        extra = {"p_value": d.p_value, "diff": d.diff, "regressions": d.regressions, "policy": asdict(policy)}
        if d.promote:   # compare-and-swap: the decision holds only against the champion it was made against
            self.promote(candidate_id, d.reason, expect=champ, **extra)
        else:
            self.set_challenger(candidate_id, d.reason, **extra)
        return d

    def rollback(self, reason: str = "manual rollback") -> CheckpointEntry:
        """Return to the champion that preceded the current one (repeatable: walks back the promotions)."""
        current = self.backend.aliases().get(CHAMPION)
        if current is None:
            raise RegistryError("no champion to roll back from")
        events = self.history()
        promo = next((e for e in reversed(events) if e.get("action") == "promote" and e.get("alias") == CHAMPION
                      and e.get("checkpoint_id") == current), None)
        target = promo.get("previous") if promo else None
        if not target:
            raise RegistryError(f"champion {current!r} has no earlier champion to roll back to")
        self.backend.swap(CHAMPION, target, {"time": _now(), "action": "rollback", "alias": CHAMPION,
                                             "checkpoint_id": target, "reason": reason}, expect=current)
        return self.get(target)


CHECKPOINT_FILES = ("lineage.json", "config.json", "adapter_config.json", "model.safetensors", "pytorch_model.bin")


def check_checkpoint_dir(uri: str) -> None:
    """A local checkpoint is a directory holding a model (a config, weights, a GGUF file or a lineage.json):
    not a missing path, an empty directory or /etc. Remote URIs are taken as given."""
    if "://" in uri and not uri.startswith("file://"):
        return
    path = Path(uri.removeprefix("file://")).expanduser()
    if not path.exists():
        raise RegistryError(f"checkpoint {uri}: no such directory")
    if not path.is_dir():
        if path.suffix == ".gguf":
            return
        raise RegistryError(f"checkpoint {uri}: not a directory")
    if not any((path / f).is_file() for f in CHECKPOINT_FILES) and not any(path.glob("*.gguf")) \
            and not any(path.glob("*.safetensors")):
        raise RegistryError(f"checkpoint {uri}: holds no model ({', '.join(CHECKPOINT_FILES)} or *.gguf)")


_CHECKPOINT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@:=-]*$")


def read_lineage(uri: str) -> dict[str, Any]:
    """``<checkpoint>/lineage.json`` as a dict ({} when the checkpoint has none)."""
    import fsspec

    try:
        with fsspec.open(f"{uri.rstrip('/')}/lineage.json", "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise RegistryError(f"{uri}/lineage.json: not JSON ({e})") from None
    except OSError as e:
        raise RegistryError(f"{uri}/lineage.json: cannot read ({e})") from None
    return data if isinstance(data, dict) else {}
