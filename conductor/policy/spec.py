"""The conductor spec: which policy writes a run's workflows, parsed once into a type.

WHY one parser and one type: the same ``--conductor`` text arrives from the command line, a YAML run
configuration, a flow parameter, a served model's lineage and a saved run configuration. It is parsed here,
once, into a frozen model per kind (``parse_conductor_spec``; litellm resolves a model string to its
provider in one function for its whole router, vLLM parses its engine arguments once into a typed config);
every other layer matches on the type (``match spec: case FixedSpec(worker=i): ...``) instead of testing
the string. ``str(spec)`` is the canonical text, so ``parse_conductor_spec(str(spec)) == spec``, and a run
configuration serialises the spec back to the text it was written as (``ConductorSpecField``).

The grammar (the head is case-insensitive; surrounding whitespace is dropped)::

    auto                               the registry's champion when one was promoted, else embedded
    champion[@REGISTRY]                the champion of $CONDUCTOR_REGISTRY (or of REGISTRY); one must exist
    embedded[:NAME]                    an embedded model via llama.cpp (default qwen2.5-coder-1.5b-instruct)
    llamacpp:FILE.gguf                 llama-cpp-python in process
    transformers:DIR[#FILE.gguf]       a HF checkpoint directory, or a GGUF file inside it
    vllm:MODEL                         vLLM offline batch engine (a path or a HF name)
    openai:MODEL[@URL][#KEY_ENV]       any OpenAI-compatible endpoint; KEY_ENV names the key's variable
    fixed:I                            baseline: worker I answers alone
    sc:I:K                             baseline: self-consistency, K samples of worker I and a majority vote
    moa:P1+P2+...:AGG                  baseline: one Mixture-of-Agents layer (``,`` also separates proposers)
    vote:P1+P2+...                     baseline: the proposers answer independently, then a majority vote
    pot:I                              baseline: program of thought, worker I writes a program, python runs it
    chain:I:R                          baseline: I reasons and writes a program, python runs it, R reports
    cascade:A+B+...:J                  baseline: cheap answers; when they all agree accept, else J decides
    random[:SEED[:MAX_STEPS]]          baseline: a random workflow per question
    menu:E1,E2,...                     the embedded model picks one entry (any spec above but random) per question

A proposer of ``vote`` and a cheap answer of ``cascade`` is an *answer item*: ``I`` (worker I answers alone),
``pot-I`` or ``chain-I-R`` (those strategies' steps), so a vote or a cascade can combine different kinds of
answers (``vote:0+pot-0+chain-0-1``, ``cascade:0+pot-0:0``).

A ``menu`` lists fixed workflows (up to ten, ``,`` between them, so ``moa`` proposers are joined by ``+`` there);
the embedded conductor model chooses one per question by writing its index, one token
(conductor/policy/menu.py).

Worker ordinals are checked against a pool where the pool is known (conductor/policy/strategies.py), and
files, packages and key variables where a run is prepared (conductor/policy/factory.py ``check_spec``);
this module touches nothing but the text.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from conductor.workflow import DEFAULT_MAX_STEPS

BACKENDS = ("embedded", "llamacpp", "transformers", "vllm", "openai")
STRATEGIES = ("fixed", "sc", "moa", "vote", "random", "pot", "chain", "cascade")
EXPECTED = ("auto, champion[@REGISTRY], embedded[:NAME], llamacpp:FILE.gguf, transformers:DIR[#FILE.gguf], "
            "vllm:MODEL, openai:MODEL[@URL][#KEY_ENV], fixed:I, sc:I:K, moa:P1+P2+...:AGG, vote:P1+P2+..., random[:SEED[:MAX_STEPS]], "
            "pot:I, chain:I:R, cascade:A+B+...:J, menu:E1,E2,...")
MAX_MENU_ENTRIES = 10   # a menu index is one token: 0..9 in SmolLM2's and Qwen2.5's vocabularies
STRATEGY_FORMS = ("fixed:I, sc:I:K, moa:P1+P2+...:AGG, vote:P1+P2+..., random[:SEED[:MAX_STEPS]], pot:I, chain:I:R "
                  "or cascade:A+B+...:J")
_ORDINAL = re.compile(r"[0-9]+")
_KEY_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConductorSpecError(ValueError):
    """A conductor spec that cannot be parsed or used; the message is one line naming the spec."""


class PolicySpecError(ConductorSpecError):
    """A model spec (embedded, llamacpp, transformers, vllm, openai) that cannot be used."""


class StrategyError(ConductorSpecError):
    """A baseline strategy spec that cannot run (bad syntax, or not over this pool)."""


def _plain(value: str, what: str, forbidden: str = "") -> str:
    """A text field that survives the round trip: non-empty, no surrounding whitespace, none of ``forbidden``."""
    if not value or value != value.strip():
        raise ValueError(f"{what} must be non-empty without surrounding whitespace")
    bad = [c for c in forbidden if c in value]
    if bad:
        raise ValueError(f"{what} must not contain {bad[0]!r}")
    return value


class _Spec(BaseModel):
    """Common behaviour: frozen, unknown fields are mistakes, ``str()`` is the canonical text."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    is_strategy: ClassVar[bool] = False
    kind: str   # each kind narrows it to its Literal: the union's discriminator

    @abstractmethod
    def __str__(self) -> str:
        """The canonical text (each kind writes its own)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class AutoSpec(_Spec):
    """``auto``: the registry's champion when one was promoted, else the embedded conductor: over a pool of
    embedded models with a python tool it chooses from a menu (conductor.policy.menu: ``default_menu``), else it
    writes the workflow."""

    kind: Literal["auto"] = "auto"

    def __str__(self) -> str:
        return "auto"


class ChampionSpec(_Spec):
    """``champion[@REGISTRY]``: the promoted champion; None: the default registry (runtime.registry_uri)."""

    kind: Literal["champion"] = "champion"
    registry: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ChampionSpec:
        if self.registry is not None:
            _plain(self.registry, "registry")
        return self

    def __str__(self) -> str:
        return "champion" if self.registry is None else f"champion@{self.registry}"


class _BackendSpec(_Spec):
    """A model that writes workflows; ``backend`` and ``target`` name it for the policy factory."""

    @property
    def backend(self) -> str:
        return self.kind

    @property
    @abstractmethod
    def target(self) -> str:
        """What the backend loads: a model name, a directory or a file."""

    @property
    def extra(self) -> str | None:
        """The GGUF file (transformers) or the key's variable name (openai)."""
        return None

    @property
    def base_url(self) -> str | None:
        return None


class EmbeddedSpec(_BackendSpec):
    """``embedded[:NAME]``: a model the project downloads and runs itself (conductor/local/embedded.py)."""

    kind: Literal["embedded"] = "embedded"
    model: str | None = None    # None: the default conductor model

    @model_validator(mode="after")
    def _check(self) -> EmbeddedSpec:
        if self.model is not None:
            _plain(self.model, "model")
        return self

    @property
    def target(self) -> str:
        from conductor.local.embedded import DEFAULT_CONDUCTOR_MODEL

        return self.model or DEFAULT_CONDUCTOR_MODEL

    def __str__(self) -> str:
        return "embedded" if self.model is None else f"embedded:{self.model}"


class LlamaCppSpec(_BackendSpec):
    """``llamacpp:FILE.gguf``: llama-cpp-python in this process."""

    kind: Literal["llamacpp"] = "llamacpp"
    path: str

    @model_validator(mode="after")
    def _check(self) -> LlamaCppSpec:
        _plain(self.path, "path")
        return self

    @property
    def target(self) -> str:
        return self.path

    def __str__(self) -> str:
        return f"llamacpp:{self.path}"


class TransformersSpec(_BackendSpec):
    """``transformers:DIR[#FILE.gguf]``: a HF checkpoint directory (one training wrote), or a GGUF file in it."""

    kind: Literal["transformers"] = "transformers"
    path: str
    gguf: str | None = None

    @model_validator(mode="after")
    def _check(self) -> TransformersSpec:
        _plain(self.path, "path", "#")
        if self.gguf is not None:
            _plain(self.gguf, "gguf")
        return self

    @property
    def target(self) -> str:
        return self.path

    @property
    def extra(self) -> str | None:
        return self.gguf

    def __str__(self) -> str:
        return f"transformers:{self.path}" + (f"#{self.gguf}" if self.gguf else "")


class VllmSpec(_BackendSpec):
    """``vllm:MODEL``: vLLM's offline batch engine over a path or a HF model name."""

    kind: Literal["vllm"] = "vllm"
    model: str

    @model_validator(mode="after")
    def _check(self) -> VllmSpec:
        _plain(self.model, "model")
        return self

    @property
    def target(self) -> str:
        return self.model

    def __str__(self) -> str:
        return f"vllm:{self.model}"


class OpenAISpec(_BackendSpec):
    """``openai:MODEL[@URL][#KEY_ENV]``: an OpenAI-compatible endpoint; the key is read from $KEY_ENV."""

    kind: Literal["openai"] = "openai"
    model: str
    url: str | None = None
    key_env: str | None = None

    @model_validator(mode="after")
    def _check(self) -> OpenAISpec:
        _plain(self.model, "model", "@#")
        if self.url is not None and not (_plain(self.url, "url", "#").startswith(("http://", "https://"))):
            raise ValueError(f"endpoint {self.url!r} must start with http:// or https://")
        if self.key_env is not None and not (self.key_env.isascii() and _KEY_ENV.fullmatch(self.key_env)):
            raise ValueError("key_env must be the NAME of an environment variable")
        return self

    @property
    def target(self) -> str:
        return self.model

    @property
    def extra(self) -> str | None:
        return self.key_env

    @property
    def base_url(self) -> str | None:
        return self.url

    def __str__(self) -> str:
        return f"openai:{self.model}" + (f"@{self.url}" if self.url else "") + (f"#{self.key_env}" if self.key_env else "")


class _StrategySpec(_Spec):
    """A baseline that writes its workflows without a model (conductor/policy/strategies.py)."""

    is_strategy: ClassVar[bool] = True

    @property
    def steps_needed(self) -> int:
        """The longest workflow it writes (a run's ``max_steps`` must allow it)."""
        return 1


class FixedSpec(_StrategySpec):
    """``fixed:I``: worker I answers alone."""

    kind: Literal["fixed"] = "fixed"
    worker: int = Field(ge=0)

    def __str__(self) -> str:
        return f"fixed:{self.worker}"


class SelfConsistencySpec(_StrategySpec):
    """``sc:I:K``: K independent samples of worker I, then a majority vote."""

    kind: Literal["sc"] = "sc"
    worker: int = Field(ge=0)
    k: int = Field(ge=1)

    @property
    def steps_needed(self) -> int:
        return self.k + 1

    def __str__(self) -> str:
        return f"sc:{self.worker}:{self.k}"


class MixtureSpec(_StrategySpec):
    """``moa:P1+P2+...:AGG``: the proposers answer independently, the aggregator sees every proposal."""

    kind: Literal["moa"] = "moa"
    proposers: tuple[Annotated[int, Field(ge=0)], ...] = Field(min_length=1)
    aggregator: int = Field(ge=0)

    @property
    def steps_needed(self) -> int:
        return len(self.proposers) + 1

    def __str__(self) -> str:
        return f"moa:{'+'.join(map(str, self.proposers))}:{self.aggregator}"


class ProgramSpec(_StrategySpec):
    """``pot:I``: program of thought: worker I writes a program that prints the answer, the python tool runs it,
    and the printout is the answer (two steps; the pool needs a ``provider: python`` worker)."""

    kind: Literal["pot"] = "pot"
    worker: int = Field(ge=0)

    @property
    def steps_needed(self) -> int:
        return 2

    def __str__(self) -> str:
        return f"pot:{self.worker}"


class ChainSpec(_StrategySpec):
    """``chain:I:R``: the untrained default's calculation pattern as a fixed workflow: worker I works the solution
    out in words and then as a program, the python tool runs it, and reporter R states the printed result (or
    the reasoning's, when the program failed)."""

    kind: Literal["chain"] = "chain"
    worker: int = Field(ge=0)
    reporter: int = Field(ge=0)

    @property
    def steps_needed(self) -> int:
        return 3

    def __str__(self) -> str:
        return f"chain:{self.worker}:{self.reporter}"


# An answer item: a worker alone (an ordinal), a program of thought or a chain, as one part of a vote or a cascade.
AnswerItem = Annotated[int, Field(ge=0)] | ProgramSpec | ChainSpec


def item_text(item: int | ProgramSpec | ChainSpec) -> str:
    """An answer item as it is written inside ``vote:`` and ``cascade:`` (``-`` instead of ``:``).

    >>> item_text(2), item_text(ProgramSpec(worker=0)), item_text(ChainSpec(worker=0, reporter=1))
    ('2', 'pot-0', 'chain-0-1')
    """
    return str(item).replace(":", "-")


def item_step_count(item: int | ProgramSpec | ChainSpec) -> int:
    """How many steps an answer item writes.

    >>> item_step_count(3), item_step_count(ChainSpec(worker=0, reporter=1))
    (1, 3)
    """
    return 1 if isinstance(item, int) else item.steps_needed


class VoteSpec(_StrategySpec):
    """``vote:P1+P2+...``: the proposers answer independently, then a majority vote over their answers. Unlike
    ``sc`` (attempts of ONE worker, which share its faults), different workers outvote a faulty one. A proposer
    is an answer item, so different KINDS of answers can vote too (``vote:0+pot-0+chain-0-1``)."""

    kind: Literal["vote"] = "vote"
    proposers: tuple[AnswerItem, ...] = Field(min_length=2)

    @property
    def steps_needed(self) -> int:
        return sum(item_step_count(p) for p in self.proposers) + 1

    def __str__(self) -> str:
        return f"vote:{'+'.join(map(item_text, self.proposers))}"


class CascadeSpec(_StrategySpec):
    """``cascade:A+B+...:J``: the cheap answer items run independently; a gate (``provider: agree``) accepts
    their answer when they all agree, and only otherwise does worker J decide, seeing them all (Yue et al.
    2023's mixture-of-thought cascade: ``cascade:0+pot-0:J`` with J a stronger model)."""

    kind: Literal["cascade"] = "cascade"
    cheap: tuple[AnswerItem, ...] = Field(min_length=2)
    decider: int = Field(ge=0)

    @property
    def steps_needed(self) -> int:
        return sum(item_step_count(p) for p in self.cheap) + 2

    def __str__(self) -> str:
        return f"cascade:{'+'.join(map(item_text, self.cheap))}:{self.decider}"


class RandomSpec(_StrategySpec):
    """``random[:SEED[:MAX_STEPS]]``: a random workflow per question (None: seed 0, at most 5 steps)."""

    kind: Literal["random"] = "random"
    seed: int | None = Field(None, ge=0)
    max_steps: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> RandomSpec:
        if self.max_steps is not None and self.seed is None:
            raise ValueError("max_steps needs a seed before it (random:SEED:MAX_STEPS)")
        return self

    @property
    def steps_needed(self) -> int:
        return self.max_steps or DEFAULT_MAX_STEPS

    def __str__(self) -> str:
        return ":".join(["random", *(str(v) for v in (self.seed, self.max_steps) if v is not None)])


class MenuSpec(_Spec):
    """``menu:E1,E2,...``: the embedded conductor model chooses one of these fixed workflows per question by
    writing its index (one token; conductor/policy/menu.py). Not a strategy: a model makes the choice.

    >>> m = parse_conductor_spec("menu:fixed:0, chain:0:1,moa:0+0:0")
    >>> str(m), m.steps_needed
    ('menu:fixed:0,chain:0:1,moa:0+0:0', 3)
    >>> parse_conductor_spec("menu:fixed:0,random")
    Traceback (most recent call last):
    ...
    conductor.policy.spec.StrategyError: conductor spec 'menu:fixed:0,random': entry 2 'random' is not a fixed workflow
    """

    kind: Literal["menu"] = "menu"
    entries: tuple[Annotated[FixedSpec | SelfConsistencySpec | MixtureSpec | VoteSpec | ProgramSpec | ChainSpec
                             | CascadeSpec, Field(discriminator="kind")], ...] = Field(min_length=1,
                                                                                         max_length=MAX_MENU_ENTRIES)

    @property
    def steps_needed(self) -> int:
        """The longest workflow on the menu (a run's ``max_steps`` must allow it)."""
        return max(e.steps_needed for e in self.entries)

    def __str__(self) -> str:
        return "menu:" + ",".join(map(str, self.entries))


StrategyBase = _StrategySpec   # every baseline spec's class (``case StrategyBase():`` matches them all)
BackendSpec = EmbeddedSpec | LlamaCppSpec | TransformersSpec | VllmSpec | OpenAISpec
StrategySpec = (FixedSpec | SelfConsistencySpec | MixtureSpec | VoteSpec | RandomSpec | ProgramSpec | ChainSpec
                | CascadeSpec)
ConductorSpec = Annotated[AutoSpec | ChampionSpec | BackendSpec | StrategySpec | MenuSpec, Field(discriminator="kind")]
BACKEND_SPECS = (EmbeddedSpec, LlamaCppSpec, TransformersSpec, VllmSpec, OpenAISpec)
STRATEGY_SPECS = (FixedSpec, SelfConsistencySpec, MixtureSpec, VoteSpec, RandomSpec, ProgramSpec, ChainSpec,
                  CascadeSpec)


def head_of(text: str) -> str:
    """The kind a spec text names (what precedes its first ``:``), without checking the rest.

    >>> head_of("sc:0:3"), head_of(" Transformers:/ckpt "), head_of("random"), head_of("ckpt-7")
    ('sc', 'transformers', 'random', 'ckpt-7')
    """
    return text.strip().partition(":")[0].lower()


def parse_conductor_spec(text: str) -> ConductorSpec:
    """The one parser of conductor specs; ConductorSpecError (one line, a subclass per family) otherwise.

    >>> parse_conductor_spec("sc:0:5")
    SelfConsistencySpec('sc:0:5')
    >>> parse_conductor_spec("openai:gpt-5@https://api.example.com/v1#MY_KEY").key_env
    'MY_KEY'
    >>> str(parse_conductor_spec("moa:0,1:2")), str(parse_conductor_spec(" EMBEDDED "))
    ('moa:0+1:2', 'embedded')
    >>> parse_conductor_spec("x")
    Traceback (most recent call last):
    ...
    conductor.policy.spec.ConductorSpecError: conductor spec 'x': unknown spec (expected one of auto, champion[@REGISTRY], embedded[:NAME], llamacpp:FILE.gguf, transformers:DIR[#FILE.gguf], vllm:MODEL, openai:MODEL[@URL][#KEY_ENV], fixed:I, sc:I:K, moa:P1+P2+...:AGG, vote:P1+P2+..., random[:SEED[:MAX_STEPS]], pot:I, chain:I:R, cascade:A+B+...:J, menu:E1,E2,...)
    """
    if not isinstance(text, str):
        raise ConductorSpecError(f"conductor spec {text!r}: expected text, got {type(text).__name__}")
    raw = text.strip()
    head, colon, rest = raw.partition(":")
    head = head.lower()
    if head in STRATEGIES:
        return _strategy(text, head, rest if colon else None)
    if head in BACKENDS:
        return _backend(text, head, rest)
    if head == "menu" and colon:
        return _menu(text, rest)
    if raw.lower() == "auto":
        return AutoSpec()
    name, at, registry = raw.partition("@")
    if name.lower() == "champion":
        return _built(ConductorSpecError, text, ChampionSpec, registry=registry.strip() or None)
    if colon:
        raise PolicySpecError(f"conductor spec {text!r}: unknown backend {raw.partition(':')[0].lower()!r} "
                              f"(expected one of {EXPECTED})")
    raise ConductorSpecError(f"conductor spec {text!r}: unknown spec (expected one of {EXPECTED})")


def _backend(text: str, backend: str, rest: str) -> BackendSpec:
    """A model spec from the text after ``backend:``."""
    if backend == "embedded":
        return _built(PolicySpecError, text, EmbeddedSpec, model=rest.strip() or None)
    if not rest.strip():
        raise PolicySpecError(f"conductor spec {text!r}: {backend} needs a target after ':'")
    if backend == "openai":
        body, _, key_env = rest.partition("#")
        if key_env and not (key_env.isascii() and _KEY_ENV.fullmatch(key_env)):
            # never echo what follows '#': a key pasted there must not reach a terminal or a log
            raise PolicySpecError(f"conductor spec {'openai:' + body + '#...'!r}: after '#' give the NAME of the environment "
                                  "variable that holds the key (e.g. OPENAI_API_KEY), not the key")
        model, _, url = body.partition("@")
        if not model.strip():
            raise PolicySpecError(f"conductor spec {text!r}: missing model name before '@'")
        if url and not url.startswith(("http://", "https://")):
            raise PolicySpecError(f"conductor spec {text!r}: endpoint {url!r} must start with http:// or https://")
        return _built(PolicySpecError, text, OpenAISpec, model=model.strip(), url=url.strip() or None,
                      key_env=key_env or None)
    if backend == "transformers":
        path, _, gguf = rest.partition("#")
        return _built(PolicySpecError, text, TransformersSpec, path=path.strip(), gguf=gguf.strip() or None)
    if backend == "llamacpp":
        return _built(PolicySpecError, text, LlamaCppSpec, path=rest.strip())
    return _built(PolicySpecError, text, VllmSpec, model=rest.strip())


def _strategy(text: str, kind: str, rest: str | None) -> StrategySpec:
    """A baseline spec from the text after ``kind:`` (None: nothing followed the kind)."""
    parts = rest.split(":") if rest is not None else []
    if kind == "fixed" and len(parts) == 1:
        return FixedSpec(worker=_ordinal(parts[0], text))
    if kind == "sc" and len(parts) == 2:
        return SelfConsistencySpec(worker=_ordinal(parts[0], text), k=_count(parts[1], text, "k", 1))
    if kind == "moa" and len(parts) == 2:
        proposers = tuple(_ordinal(p, text) for p in parts[0].replace("+", ",").split(","))
        return MixtureSpec(proposers=proposers, aggregator=_ordinal(parts[1], text))
    if kind == "vote" and len(parts) == 1:
        voters = tuple(_item(p, text) for p in parts[0].replace("+", ",").split(","))
        if len(voters) < 2:
            raise StrategyError(f"strategy {text!r}: a vote needs at least two proposers")
        return VoteSpec(proposers=voters)
    if kind == "pot" and len(parts) == 1:
        return ProgramSpec(worker=_ordinal(parts[0], text))
    if kind == "chain" and len(parts) == 2:
        return ChainSpec(worker=_ordinal(parts[0], text), reporter=_ordinal(parts[1], text))
    if kind == "cascade" and len(parts) == 2:
        cheap = tuple(_item(p, text) for p in parts[0].split("+"))
        if len(cheap) < 2:
            raise StrategyError(f"strategy {text!r}: a cascade needs at least two cheap answers to compare")
        return CascadeSpec(cheap=cheap, decider=_ordinal(parts[1], text))
    if kind == "random" and len(parts) <= 2:
        seed = _count(parts[0], text, "seed", 0) if parts else None
        max_steps = _count(parts[1], text, "max_steps", 1) if len(parts) > 1 else None
        return RandomSpec(seed=seed, max_steps=max_steps)
    raise StrategyError(f"strategy {text!r}: expected {STRATEGY_FORMS}")


def _menu(text: str, rest: str) -> MenuSpec:
    """A menu from the text after ``menu:``: comma-separated strategy specs, each one a fixed workflow."""
    names = [part.strip() for part in rest.split(",")]
    if not 1 <= len(names) <= MAX_MENU_ENTRIES:
        raise StrategyError(f"conductor spec {text!r}: {len(names)} entries; 1 to {MAX_MENU_ENTRIES} (one-token indices)")
    entries = []
    for i, name in enumerate(names, 1):
        head = head_of(name)
        if head not in STRATEGIES:
            raise StrategyError(f"conductor spec {text!r}: entry {i} {name!r}: expected {STRATEGY_FORMS}")
        entry = _strategy(name, head, name.partition(":")[2] if ":" in name else None)
        if isinstance(entry, RandomSpec):
            raise StrategyError(f"conductor spec {text!r}: entry {i} {name!r} is not a fixed workflow")
        entries.append(entry)
    return MenuSpec(entries=tuple(entries))


def _item(part: str, text: str) -> int | ProgramSpec | ChainSpec:
    """An answer item: ``I``, ``pot-I`` or ``chain-I-R``."""
    head, _, rest = part.strip().partition("-")
    if head == "pot" and rest:
        return ProgramSpec(worker=_ordinal(rest, text))
    if head == "chain" and rest.count("-") == 1:
        worker, reporter = rest.split("-")
        return ChainSpec(worker=_ordinal(worker, text), reporter=_ordinal(reporter, text))
    if head in ("pot", "chain"):
        raise StrategyError(f"strategy {text!r}: {part!r}: expected pot-I or chain-I-R")
    return _ordinal(part, text)


def _ordinal(part: str, text: str) -> int:
    if not _ORDINAL.fullmatch(part.strip()):
        raise StrategyError(f"strategy {text!r}: {part!r} is not a worker number")
    return int(part)


def _count(part: str, text: str, what: str, low: int) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", part.strip()):
        raise StrategyError(f"strategy {text!r}: {what} {part!r} is not an integer")
    if int(part) < low:
        raise StrategyError(f"strategy {text!r}: {what} must be at least {low}")
    return int(part)


def _built(error: type[ConductorSpecError], text: str, cls: type[Any], **fields: Any) -> Any:
    """``cls(**fields)``, a field the round trip cannot keep being one line of ``error``."""
    try:
        return cls(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        raise error(f"conductor spec {text!r}: {err['msg'].removeprefix('Value error, ')}") from None


def as_conductor_spec(spec: ConductorSpec | str) -> ConductorSpec:
    """A typed spec as it is, a text one parsed (the boundary for callers that still hold text)."""
    return parse_conductor_spec(spec) if isinstance(spec, str) else spec


def is_strategy_text(spec: ConductorSpec | str) -> bool:
    """A spec (or text) of a baseline strategy, even one whose rest does not parse (its error comes later).

    >>> [is_strategy_text(s) for s in ("fixed:0", "sc:x", "random", "embedded", "ckpt-7")]
    [True, True, True, False, False]
    """
    return spec.is_strategy if isinstance(spec, _Spec) else head_of(spec) in STRATEGIES


def is_embedded_checkpoint(checkpoint_id: str) -> bool:
    """Whether a run's checkpoint id names the untrained embedded conductor (writing workflows, or choosing from a
    menu: it gets the informed prompt and decodes greedily). A conductor that does not come from a registry is
    identified by its spec's canonical text, so this is a question about the spec.

    >>> [is_embedded_checkpoint(c) for c in ("embedded:qwen2.5-coder-1.5b", "embedded", "ckpt-7", "fixed:0",
    ...                                      "menu:fixed:0,chain:0:1")]
    [True, True, False, False, True]
    """
    return head_of(checkpoint_id) in ("embedded", "menu")


def is_single_worker(label: str) -> bool:
    """Whether a strategy label (a spec's text, or any other name a comparison gives a run) is one worker alone.

    >>> [is_single_worker(s) for s in ("fixed:2", "fixed:x", "sc:0:3", "conductor")]
    [True, False, False, False]
    """
    if head_of(label) != "fixed":
        return False
    try:
        return isinstance(parse_conductor_spec(label), FixedSpec)
    except ConductorSpecError:
        return False


def _validate(value: Any) -> Any:
    """A run configuration's ``conductor`` value: text is parsed here; a typed spec or a mapping passes on."""
    if not isinstance(value, str):
        return value
    try:
        return parse_conductor_spec(value)
    except ConductorSpecError as e:
        raise PydanticCustomError("conductor_spec", "{reason}", {"reason": str(e)}) from None


# A run configuration's field: YAML and CLI text validates into the type; it serialises back to the text, so
# configurations saved with runs (and Prefect's stored flow parameters) stay readable by older code too.
ConductorSpecField = Annotated[ConductorSpec, BeforeValidator(_validate), PlainSerializer(str, return_type=str),
                               WithJsonSchema({"type": "string", "description": "a conductor spec, e.g. auto, fixed:0"})]
