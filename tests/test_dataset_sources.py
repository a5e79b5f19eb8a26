"""Named datasets load anywhere (conductor/data/sources.py): $CONDUCTOR_SHARED_DATA, the checkout's shared
folder, the rows shipped in the package, the Hugging Face hub through ``datasets`` (here a local dataset
repository, never the network), and one error line naming every source when none is reachable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.data import sources
from conductor.data.datasets import DatasetError, load_dataset
from conductor.data.questionset import load_questions

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "conductor" / "data" / "bundled"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """A checkout with no shared folder beside it and no $CONDUCTOR_SHARED_DATA."""
    monkeypatch.delenv("CONDUCTOR_SHARED_DATA", raising=False)
    monkeypatch.setattr(sources, "project_root", lambda: tmp_path / "clone")
    return tmp_path


def test_conductor_shared_data_comes_first(bare, monkeypatch):
    _write(bare / "mine" / "gsm8k_test.jsonl", [{"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}])
    _write(bare / "shared" / "data" / "gsm8k_test.jsonl", [{"question": "beside", "answer": "#### 5"}])
    monkeypatch.setenv("CONDUCTOR_SHARED_DATA", str(bare / "mine"))
    qs = load_dataset("gsm8k_test", limit=5)
    assert [(q.id, q.gold) for q in qs] == [("gsm8k/test/0", "4")]
    assert qs[0].metadata["solution"].startswith("2 + 2")


def test_the_checkout_shared_folder_is_next(bare):
    _write(bare / "shared" / "data" / "mmlu_stem.jsonl",
           [{"question": "Which is a noble gas?", "type": "high_school_chemistry",
             "choices": ["N", "O", "Ne", "H"], "answer": 2}])
    qs = load_dataset("mmlu_stem", limit=3)          # fits in the bundled rows, but the shared folder wins
    assert [(q.id, q.gold, q.metadata["subject"]) for q in qs] == [("mmlu_stem/test/0", "C", "high_school_chemistry")]


def test_the_package_rows_serve_the_quickstart_from_a_bare_checkout(bare):
    qs = load_questions("gsm8k_test:5,mmlu_stem[95:100]")
    gsm, mmlu = _rows(BUNDLED / "gsm8k_test.jsonl"), _rows(BUNDLED / "mmlu_stem.jsonl")
    assert [q.id for q in qs] == [f"gsm8k/test/{i}" for i in range(5)] + [f"mmlu_stem/test/{i}" for i in range(95, 100)]
    assert qs[0].gold == gsm[0]["answer"].rsplit("####", 1)[1].strip() and qs[5].metadata["subject"] == mmlu[95]["type"]
    assert len(gsm) == len(mmlu) == sources.BUNDLED_ROWS
    assert (BUNDLED / "LICENSE.gsm8k").read_text().startswith("MIT License")
    assert (BUNDLED / "LICENSE.mmlu").read_text().startswith("MIT License")


def test_the_package_rows_are_the_first_rows_of_the_shared_files():
    shared = ROOT.parent / "shared" / "data"
    if not (shared / "gsm8k_test.jsonl").is_file():
        pytest.skip("no shared folder beside this checkout to compare with")
    for name in ("gsm8k_test.jsonl", "mmlu_stem.jsonl"):
        assert _rows(BUNDLED / name) == _rows(shared / name)[: sources.BUNDLED_ROWS], name


# ------------------------------------------------------------------ the hub, from a local dataset repository

HUB_SCRIPT = """
import json, sys
from conductor.data import sources
from pathlib import Path
sources.project_root = lambda: Path("clone")          # no shared folder beside it
from conductor.data.datasets import load_dataset
try:
    qs = load_dataset(sys.argv[1], limit=int(sys.argv[2]))
except Exception as e:
    print("ERROR", type(e).__name__, e)
    sys.exit(2)
print(json.dumps([[q.id, q.gold, q.metadata.get("subject")] for q in qs]))
"""


def _hub_repo(root: Path, repo: str, configs: dict[str, list[dict]], split: str) -> None:
    """A dataset repository laid out as on the hub (a parquet file per config and split, configs in the card),
    at ``root/<repo>``: ``datasets.load_dataset("<repo>", config)`` run in ``root`` reads it, never the network."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    card = ["---", "configs:"]
    for config, rows in configs.items():
        (root / repo / config).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), root / repo / config / f"{split}-00000-of-00001.parquet")
        card += [f"- config_name: {config}", "  data_files:", f"  - split: {split}", f"    path: {config}/{split}-*"]
    (root / repo / "README.md").write_text("\n".join(card + ["---", ""]), encoding="utf-8")


def _run_hub(cwd: Path, name: str, limit: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CONDUCTOR_SHARED_DATA"))}
    env.update(PYTHONPATH=str(ROOT), HF_HOME=str(cwd / "hf-home"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", HUB_SCRIPT, name, str(limit)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_request_larger_than_the_package_rows_comes_from_the_hub(tmp_path):
    pytest.importorskip("datasets")
    gsm = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(130)]
    _hub_repo(tmp_path, "openai/gsm8k", {"main": gsm}, "test")
    proc = _run_hub(tmp_path, "gsm8k_test", 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert [g[:2] for g in got] == [[f"gsm8k/test/{i}", str(i + 1)] for i in range(120)]


def test_mmlu_stem_from_the_hub_reads_the_subjects_in_the_shared_files_order(tmp_path):
    pytest.importorskip("datasets")
    first, second = sources.MMLU_STEM_SUBJECTS[:2]

    def rows(subject: str, n: int) -> list[dict]:
        return [{"question": f"{subject} {i}?", "subject": subject, "choices": ["a", "b", "c", "d"], "answer": i % 4}
                for i in range(n)]

    _hub_repo(tmp_path, "cais/mmlu", {first: rows(first, 90), second: rows(second, 40)}, "test")
    proc = _run_hub(tmp_path, "mmlu_stem", 110)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert len(got) == 110 and got[0] == ["mmlu_stem/test/0", "A", first]
    assert got[90] == ["mmlu_stem/test/90", "A", second] and got[-1][2] == second


def test_nothing_reachable_is_one_line_naming_every_source(tmp_path):
    pytest.importorskip("datasets")
    proc = _run_hub(tmp_path, "gsm8k_test", 500)      # offline, an empty hub cache, no shared folder
    assert proc.returncode == 2
    line = proc.stdout.strip()
    assert "\n" not in line and line.startswith("ERROR DatasetError gsm8k_test.jsonl: not found")
    for source in ("$CONDUCTOR_SHARED_DATA (unset)", "the checkout's shared folder", "Hugging Face openai/gsm8k",
                   "HF_DATASETS_OFFLINE", "ships its first 100 rows"):
        assert source in line, source


def test_a_bare_clone_answers_the_quickstart_questions_and_fails_larger_ones_in_one_line(tmp_path):
    """A copy of the package with nothing beside it: the quickstart's questions load; a larger set fails with
    one line and exit code 2 before anything runs."""
    clone = tmp_path / "clone"
    for part in ("conductor", "data"):
        shutil.copytree(ROOT / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CONDUCTOR_SHARED_DATA"))}
    env.update(PYTHONPATH=str(clone), HF_HOME=str(tmp_path / "hf-home"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    ok = subprocess.run([sys.executable, "-c", "from conductor.data.questionset import load_questions as l; "
                         "print(len(l('gsm8k_test:5,mmlu_stem:5')))"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0 and ok.stdout.strip() == "10", ok.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-m", "conductor", "answer", "gsm8k_test:500", "--out", str(tmp_path / "o"),
                          "--pool", str(clone / "data" / "pools" / "simulated.yaml"), "--conductor", "fixed:0"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "gsm8k_test.jsonl: not found" in errors[0] and "Hugging Face" in errors[0]
    assert "Traceback" not in bad.stderr
    assert not (tmp_path / "o" / "answers.jsonl").exists()


def test_an_unknown_shared_file_names_the_sources_tried(bare):
    with pytest.raises(DatasetError, match=r"aime24\.jsonl: not found in \$CONDUCTOR_SHARED_DATA \(unset\); .*"
                                           r"Hugging Face hub \(no known copy"):
        load_dataset("aime24")
