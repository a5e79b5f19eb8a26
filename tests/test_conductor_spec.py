"""The conductor spec is parsed once, into a type (conductor/policy/spec.py); the few-shot and limits settings
likewise. Every variant round-trips through its text, every malformed text is one line naming the spec, and
a run configuration holds the types but reads and writes the text."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from conductor.execution.shared_limits import LimitsSpec
from conductor.policy.spec import (
    AutoSpec,
    ChainSpec,
    ChampionSpec,
    ConductorSpec,
    ConductorSpecError,
    EmbeddedSpec,
    FixedSpec,
    LlamaCppSpec,
    MenuSpec,
    MixtureSpec,
    OpenAISpec,
    PolicySpecError,
    RandomSpec,
    SelfConsistencySpec,
    StrategyError,
    TransformersSpec,
    VllmSpec,
    VoteSpec,
    is_embedded_checkpoint,
    parse_conductor_spec,
)
from conductor.prompts import FewShotSpec
from conductor.run.config import AnswerConfig, ConfigError, RolloutConfig

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- a corpus of every variant

CORPUS = [
    ("auto", AutoSpec()),
    ("champion", ChampionSpec()),
    ("champion@s3://bucket/registry", ChampionSpec(registry="s3://bucket/registry")),
    ("embedded", EmbeddedSpec()),
    ("embedded:smollm2-135m-instruct", EmbeddedSpec(model="smollm2-135m-instruct")),
    ("llamacpp:/models/x.gguf", LlamaCppSpec(path="/models/x.gguf")),
    ("transformers:/ckpt/dir", TransformersSpec(path="/ckpt/dir")),
    ("transformers:/ckpt/dir#model.gguf", TransformersSpec(path="/ckpt/dir", gguf="model.gguf")),
    ("vllm:Qwen/Qwen2.5-7B-Instruct", VllmSpec(model="Qwen/Qwen2.5-7B-Instruct")),
    ("openai:gpt-5", OpenAISpec(model="gpt-5")),
    ("openai:qwen@http://127.0.0.1:8080/v1", OpenAISpec(model="qwen", url="http://127.0.0.1:8080/v1")),
    ("openai:m@https://u:pw@host/v1#MY_KEY", OpenAISpec(model="m", url="https://u:pw@host/v1", key_env="MY_KEY")),
    ("fixed:0", FixedSpec(worker=0)),
    ("sc:1:5", SelfConsistencySpec(worker=1, k=5)),
    ("moa:0+1+2:1", MixtureSpec(proposers=(0, 1, 2), aggregator=1)),
    ("vote:0+2+3", VoteSpec(proposers=(0, 2, 3))),
    ("random", RandomSpec()),
    ("random:7", RandomSpec(seed=7)),
    ("random:7:3", RandomSpec(seed=7, max_steps=3)),
    ("menu:fixed:0,chain:0:1", MenuSpec(entries=(FixedSpec(worker=0), ChainSpec(worker=0, reporter=1)))),
    ("menu:moa:0+1:1,vote:0+1", MenuSpec(entries=(MixtureSpec(proposers=(0, 1), aggregator=1),
                                                  VoteSpec(proposers=(0, 1))))),
]


@pytest.mark.parametrize("text, spec", CORPUS, ids=[t for t, _ in CORPUS])
def test_every_variant_parses_to_its_type_and_prints_back_to_its_text(text, spec):
    parsed = parse_conductor_spec(text)
    assert parsed == spec and type(parsed) is type(spec)
    assert str(parsed) == text
    assert parse_conductor_spec(str(parsed)) == parsed
    assert TypeAdapter(ConductorSpec).validate_python(spec.model_dump()) == spec   # the discriminated union


@pytest.mark.parametrize("text, canonical", [
    (" Embedded ", "embedded"), ("moa:0,1:2", "moa:0+1:2"), ("vote:2,0", "vote:2+0"), ("TRANSFORMERS:/d", "transformers:/d"),
    ("champion@", "champion"), ("fixed: 3", "fixed:3"), ("AUTO", "auto"), ("embedded:", "embedded"),
])
def test_spellings_have_one_canonical_text(text, canonical):
    assert str(parse_conductor_spec(text)) == canonical


def test_layers_match_on_the_type():
    def steps(spec):
        match spec:
            case SelfConsistencySpec(k=k):
                return k + 1
            case MixtureSpec(proposers=p):
                return len(p) + 1
            case FixedSpec():
                return 1
        return None

    assert [steps(parse_conductor_spec(t)) for t in ("sc:0:4", "moa:0+1:0", "fixed:2", "auto")] == [5, 3, 1, None]
    assert [parse_conductor_spec(t).is_strategy for t in ("sc:0:4", "random", "vllm:m", "champion")] == [
        True, True, False, False]


# ---------------------------------------------------------------- errors: one line, naming the spec

@pytest.mark.parametrize("text, error, message", [
    ("x", ConductorSpecError, "conductor spec 'x': unknown spec (expected one of auto, champion[@REGISTRY]"),
    ("", ConductorSpecError, "unknown spec"),
    ("championship", ConductorSpecError, "unknown spec"),
    ("auto@x", ConductorSpecError, "unknown spec"),
    ("gguf:/x", PolicySpecError, "unknown backend 'gguf'"),
    ("transformers:", PolicySpecError, "transformers needs a target after ':'"),
    ("vllm:  ", PolicySpecError, "vllm needs a target"),
    ("openai:@http://x/v1", PolicySpecError, "missing model name before '@'"),
    ("openai:m@ftp://x", PolicySpecError, "must start with http:// or https://"),
    ("fixed:x", StrategyError, "strategy 'fixed:x': 'x' is not a worker number"),
    ("fixed:-1", StrategyError, "'-1' is not a worker number"),
    ("fixed", StrategyError, "expected fixed:I, sc:I:K"),
    ("sc:1", StrategyError, "expected fixed:I, sc:I:K"),
    ("sc:0:0", StrategyError, "k must be at least 1"),
    ("moa:0+x:1", StrategyError, "'x' is not a worker number"),
    ("moa:0+1", StrategyError, "expected fixed:I"),
    ("vote:1", StrategyError, "a vote needs at least two proposers"),
    ("vote:0+1:2", StrategyError, "expected fixed:I"),
    ("random:a", StrategyError, "seed 'a' is not an integer"),
    ("random:1:0", StrategyError, "max_steps must be at least 1"),
    ("random:1:2:3", StrategyError, "expected fixed:I"),
    ("menu:fixed:0,random", StrategyError, "entry 2 'random' is not a fixed workflow"),
    ("menu:fixed:0,,fixed:1", StrategyError, "entry 2 '': expected fixed:I"),
    ("menu:fixed:0,sc:1", StrategyError, "strategy 'sc:1': expected fixed:I"),
    ("menu:embedded", StrategyError, "entry 1 'embedded': expected fixed:I"),
    ("menu:" + ",".join(["fixed:0"] * 11), StrategyError, "11 entries; 1 to 10"),
    ("menu", ConductorSpecError, "unknown spec"),
])
def test_malformed_specs_are_one_line_errors_of_their_family(text, error, message):
    with pytest.raises(error, match=re.escape(message)) as e:
        parse_conductor_spec(text)
    assert "\n" not in str(e.value)


def test_a_key_pasted_after_the_hash_is_never_echoed():
    with pytest.raises(PolicySpecError) as e:
        parse_conductor_spec("openai:m@https://h/v1#sk-proj-SECRET123")
    assert "SECRET" not in str(e.value) and "NAME of the environment variable" in str(e.value)


@given(st.text(max_size=40))
def test_any_text_parses_to_a_fixed_point_or_is_one_clean_line(text):
    try:
        spec = parse_conductor_spec(text)
    except ConductorSpecError as e:
        assert "\n" not in str(e).replace(repr(text), "")
    else:
        assert parse_conductor_spec(str(spec)) == spec and str(parse_conductor_spec(str(spec))) == str(spec)


# ---------------------------------------------------------------- round trip of every typed value

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
_n = st.integers(0, 10_000)
_specs = st.one_of(
    st.just(AutoSpec()),
    st.builds(ChampionSpec, registry=st.none() | _text),
    st.builds(EmbeddedSpec, model=st.none() | _text),
    st.builds(LlamaCppSpec, path=_text),
    st.builds(TransformersSpec, path=_text, gguf=st.none() | _text),
    st.builds(VllmSpec, model=_text),
    st.builds(OpenAISpec, model=_text, url=st.none() | _text.map(lambda t: "http://" + t),
              key_env=st.none() | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)),
    st.builds(FixedSpec, worker=_n),
    st.builds(SelfConsistencySpec, worker=_n, k=st.integers(1, 64)),
    st.builds(MixtureSpec, proposers=st.lists(_n, min_size=1, max_size=5).map(tuple), aggregator=_n),
    st.builds(VoteSpec, proposers=st.lists(_n, min_size=2, max_size=5).map(tuple)),
    st.builds(RandomSpec, seed=_n) | st.builds(RandomSpec, seed=_n, max_steps=st.integers(1, 20)) | st.just(RandomSpec()),
)


@st.composite
def valid_specs(draw):
    """Typed specs; a draw the model refuses (text its grammar could not keep) is skipped."""
    try:
        return draw(_specs)
    except ValidationError:
        assume(False)


@given(valid_specs())
def test_parse_of_str_is_the_spec(spec):
    assert parse_conductor_spec(str(spec)) == spec


# ---------------------------------------------------------------- few-shot and limits settings

@pytest.mark.parametrize("text", ["auto", "ood", "ood:2", "in_domain:0", "mixed", "none", "informed:3"])
def test_fewshot_settings_round_trip(text):
    assert str(FewShotSpec.parse(text)) == text and FewShotSpec.parse(str(FewShotSpec.parse(text))) == FewShotSpec.parse(text)


@pytest.mark.parametrize("text", ["x", "ood:-1", "ood:a", "auto:2", "ood:"])
def test_bad_fewshot_settings_are_refused(text):
    with pytest.raises(ValueError, match="few-shot policy"):
        FewShotSpec.parse(text)


def test_fewshot_auto_resolves_per_checkpoint():
    auto = FewShotSpec.parse("auto")
    assert str(auto.resolved(is_embedded_checkpoint("embedded:qwen2.5-coder-1.5b-instruct"))) == "informed"
    assert str(auto.resolved(is_embedded_checkpoint("ckpt-7"))) == "ood" and FewShotSpec.parse("ood:1").resolved(True).k == 1


@pytest.mark.parametrize("text, store, where", [("local", "local", None), ("sqlite:/tmp/l.sqlite", "sqlite", "/tmp/l.sqlite"),
                                                 ("prefect", "prefect", None), ("prefect:team", "prefect", "team")])
def test_limits_settings_round_trip(text, store, where):
    spec = LimitsSpec.parse(text)
    assert (spec.store, spec.where, str(spec)) == (store, where, text)


@pytest.mark.parametrize("text", ["sqlite:", "redis:x", "sqlite"])
def test_bad_limits_settings_are_refused(text):
    with pytest.raises(ValueError, match="expected 'local', 'sqlite:PATH' or 'prefect"):
        LimitsSpec.parse(text)


# ---------------------------------------------------------------- the run configuration holds the types

def test_the_config_holds_types_and_saves_the_text(tmp_path):
    cfg = AnswerConfig(questions="q.jsonl", out=str(tmp_path), conductor="sc:0:3", fewshot="ood:2",
                       limits="sqlite:/tmp/l.sqlite")
    assert cfg.conductor == SelfConsistencySpec(worker=0, k=3)
    assert cfg.fewshot == FewShotSpec(policy="ood", k=2) and cfg.limits == LimitsSpec(store="sqlite", where="/tmp/l.sqlite")
    saved = json.loads(cfg.model_dump_json())
    assert (saved["conductor"], saved["fewshot"], saved["limits"]) == ("sc:0:3", "ood:2", "sqlite:/tmp/l.sqlite")
    assert AnswerConfig.model_validate(saved) == cfg and AnswerConfig.model_validate_json(cfg.model_dump_json()) == cfg
    default = AnswerConfig(questions="q", out=str(tmp_path))
    assert (default.conductor, str(default.fewshot), default.limits) == (AutoSpec(), "auto", None)
    assert cfg.pipeline_settings()["fewshot"] == FewShotSpec(policy="ood", k=2)   # the RunSpec holds the type (#50)


def test_a_typed_value_passes_through_the_config():
    cfg = RolloutConfig(questions="q", lake="/l", pool="/p", run_id="r", conductor=FixedSpec(worker=1),
                        fewshot=FewShotSpec(policy="none"))
    assert cfg.conductor == FixedSpec(worker=1) and str(cfg.fewshot) == "none"


def test_a_saved_run_config_is_read_back(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("questions: q.jsonl\nout: o\nconductor: moa:0,1:2\nfewshot: informed:2\nlimits: prefect\n")
    cfg = AnswerConfig.build(f)
    assert cfg.conductor == MixtureSpec(proposers=(0, 1), aggregator=2) and str(cfg.limits) == "prefect"


@pytest.mark.parametrize("field, value, message", [
    ("conductor", "x", "--conductor: conductor spec 'x': unknown spec (expected one of"),
    ("conductor", "sc:1", "--conductor: strategy 'sc:1': expected fixed:I"),
    ("fewshot", "odd", "--fewshot: few-shot policy 'odd'"),
    ("limits", "redis:x", "--limits: limits 'redis:x': expected 'local'"),
])
def test_a_bad_value_names_its_option(field, value, message):
    with pytest.raises(ConfigError) as e:
        AnswerConfig.build(None, {"questions": "q", "out": "o", field: value})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_bad_value_in_a_file_names_the_file_and_field(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("questions: q\nout: o\nconductor: torch:/x\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: field conductor: conductor spec 'torch:/x': unknown backend 'torch'"):
        AnswerConfig.build(f)


# ---------------------------------------------------------------- one parser

def test_only_the_spec_module_parses_conductor_specs():
    """No layer tests the spec text itself: the partition/startswith parsing of old lives in one module."""
    pattern = re.compile(r"""(spec|conductor)\w*\.(partition|startswith|split)\(|(spec|conductor) == ["'](auto|embedded)""")
    files = ["conductor/run/runtime.py", "conductor/run/preflight.py", "conductor/policy/strategies.py",
             "conductor/policy/factory.py", "conductor/cli/answer_cmd.py", "conductor/cli/headroom_cmd.py"]
    offenders = [f"{f}:{i}" for f in files for i, line in enumerate((ROOT / f).read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def test_the_answer_cli_refuses_a_bad_spec_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "conductor.cli", "answer", "q.jsonl", "--out", str(tmp_path / "o"),
                        "--conductor", "fixed:x"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "error: --conductor: strategy 'fixed:x': 'x' is not a worker number"
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- prepared once per answer

def _questions(tmp_path: Path) -> Path:
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                         for i in range(2)))
    return f


def test_prepared_inputs_are_handed_over_once(tmp_path):
    from conductor.run import preflight

    cfg = AnswerConfig(questions=str(_questions(tmp_path)), out=str(tmp_path / "o"),
                       pool=str(ROOT / "data/pools/simulated.yaml"), conductor="fixed:0")
    first = preflight.prepare_answer(cfg, hand_over=True)
    assert preflight.prepare_answer(first.config) is first          # the flow's call takes them over
    again = preflight.prepare_answer(first.config)                   # any later call prepares afresh...
    assert again is not first and again.config == first.config     # ...to the same resolved inputs
    assert preflight.prepare_answer(cfg) is not first


def test_the_answer_command_prepares_its_run_once(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from conductor.cli import app
    from conductor.run import preflight

    calls = []
    real = preflight._prepare
    monkeypatch.setattr(preflight, "_prepare", lambda config: calls.append(config) or real(config))
    r = CliRunner().invoke(app, ["answer", str(_questions(tmp_path)), "--out", str(tmp_path / "o"), "--pool",
                                 str(ROOT / "data/pools/simulated.yaml"), "--conductor", "moa:0,1:0"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1
    rows = [json.loads(line) for line in (tmp_path / "o" / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == 2


def test_a_menu_is_checked_entry_by_entry_against_the_pool_before_anything_starts():
    """``menu:`` (the embedded model picks one fixed workflow per question): each entry is checked as a strategy
    over the run's pool and its max_steps, in one line naming the entry, and the run gets the informed prompt
    and greedy decoding as the untrained embedded conductor does."""
    from conductor.run.preflight import UsageError, check_conductor
    from conductor.workers.pool import load_pool

    pool = load_pool(ROOT / "data/pools/local.yaml")
    assert check_conductor(parse_conductor_spec("menu:fixed:0, chain:0:1"), pool, 3) == "menu:fixed:0,chain:0:1"
    with pytest.raises(UsageError, match=re.escape("--conductor: strategy 'cascade:0+pot-0:0' writes 5 steps: "
                                                   "run it with --max-steps 5 or more")):
        check_conductor(parse_conductor_spec("menu:fixed:0,cascade:0+pot-0:0"), pool, 3)
    with pytest.raises(UsageError, match=r"--conductor: strategy 'fixed:7'.*"):
        check_conductor(parse_conductor_spec("menu:fixed:0,fixed:7"), pool, 3)
    from conductor.run.preflight import check_k

    with pytest.raises(UsageError, match=re.escape("--k 2: a menu 'menu:fixed:0' runs over the whole pool; drop --k")):
        check_k(2, pool, parse_conductor_spec("menu:fixed:0"))
    assert is_embedded_checkpoint("menu:fixed:0,chain:0:1")
    assert FewShotSpec(policy="auto").resolved(is_embedded_checkpoint("menu:fixed:0")).policy == "informed"


def test_auto_without_a_champion_is_the_default_menu_over_the_embedded_pool_and_writes_elsewhere(tmp_path,
                                                                                                monkeypatch):
    """Before any champion, ``auto`` over the embedded pool is the untrained 1.5B choosing between its own two
    workflows (reasoner alone, reasoner -> python -> reporter); over a pool without an embedded reasoner or a
    python tool, and without llama.cpp in process, the writing conductor; the preflight's checkpoint id says the
    same as what the run will load."""
    from conductor.policy.spec import AutoSpec, EmbeddedSpec
    from conductor.run.preflight import check_conductor
    from conductor.run.runtime import EMBEDDED_CHECKPOINT, effective_spec
    from conductor.workers.pool import load_pool

    monkeypatch.setenv("CONDUCTOR_REGISTRY", str(tmp_path / "no-registry"))
    local, simulated = load_pool(ROOT / "data/pools/local.yaml"), load_pool(ROOT / "data/pools/simulated.yaml")
    assert str(effective_spec(AutoSpec(), local, in_process=True)) == "menu:fixed:0,chain:0:1"
    assert effective_spec(AutoSpec(), local, in_process=False) == EmbeddedSpec()
    assert effective_spec(AutoSpec(), simulated, in_process=True) == EmbeddedSpec()
    assert effective_spec(parse_conductor_spec("fixed:1"), local, in_process=True) == parse_conductor_spec("fixed:1")
    assert check_conductor(AutoSpec(), simulated, 3) == EMBEDDED_CHECKPOINT
    monkeypatch.setenv("CONDUCTOR_EMBEDDED_SERVER", "llamacpp")
    pytest.importorskip("llama_cpp")
    assert check_conductor(AutoSpec(), local, 3) == "menu:fixed:0,chain:0:1"
