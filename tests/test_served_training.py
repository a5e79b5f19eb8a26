"""Served traffic becomes training data: requests answered by `conductor serve` (the real server, the real openai
SDK, the real lake) are labelled from a labels file by response id, by text, or by the hash that stands for
redacted text, and the nightly run puts them first in its training mix (conductor/data/served.py)."""

from __future__ import annotations

import json

import openai
import pytest

from conductor.data.questionset import load_questions
from conductor.data.served import (
    ServedTraffic,
    read_served,
    redaction_mark,
    select_labelled,
    write_selection,
)
from conductor.run.config import NightlyConfig
from conductor.run.nightly import plan_night, served_mix
from conductor.serve.config import ServeConfig
from tests.test_serve_support import ROOT, LiveServer, questions, simulated_pool

ITEMS = questions(6)


def _labels(tmp_path, rows):
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_traffic_matches_labels_by_id_text_and_redaction_mark(tmp_path):
    traffic = ServedTraffic.of([("served/abc-1", "[REDACTED:" + redaction_mark("Q one")[10:]),
                                ("served/abc-2", "Q   Two?"), ("served/abc-3", redaction_mark("other"))])
    assert traffic.requests == 3 and traffic.ids == {"abc-1", "abc-2", "abc-3"}
    labels = _labels(tmp_path, [
        {"question": "q one", "answer": "1"},                         # text differs by case: not the hashed text
        {"question": "Q one", "answer": "1"},                         # the redacted request, by hash
        {"question": "q two?", "answer": "2"},                        # the stored text, normalised
        {"id": "chatcmpl-abc-3", "question": "unseen text", "answer": "3"},   # by response id
        {"id": "resp_zzz", "question": "never asked", "answer": "4"},
    ])
    sel = select_labelled(traffic, str(labels))
    assert [r["answer"] for r in sel.rows] == ["1", "2", "3"]
    assert [r["id"] for r in sel.rows] == ["labels/all/1", "labels/all/2", "chatcmpl-abc-3"]
    assert sel.labels == 5 and sel.requests == 3 and sel.labelled == 3
    # the selection reads back as the labels file would: same dataset, ids, gold and prompts
    out = write_selection(sel, str(labels), tmp_path / "night")
    again = {q.id: q for q in load_questions(str(out))}
    direct = {q.id: q for q in load_questions(str(labels))}
    assert set(again) == {"labels/all/1", "labels/all/2", "chatcmpl-abc-3"}
    for qid, q in again.items():
        assert (q.dataset, q.prompt, q.gold, q.domain) == (direct[qid].dataset, direct[qid].prompt,
                                                           direct[qid].gold, direct[qid].domain)


def test_a_label_row_without_question_text_is_one_clear_error(tmp_path):
    from conductor.data.datasets import DatasetError

    labels = _labels(tmp_path, [{"question": "ok", "answer": "1"}, {"id": "x", "answer": "2"}])
    with pytest.raises(DatasetError, match=r"labels\.jsonl:2: missing or empty field 'question'"):
        select_labelled(ServedTraffic(), str(labels))


def test_an_empty_or_missing_lake_has_no_served_traffic(tmp_path):
    assert read_served(str(tmp_path / "no-lake")).requests == 0


@pytest.mark.parametrize("store_text", [False, True])
def test_requests_served_by_the_real_server_are_labelled_and_join_the_nightly_mix(tmp_path, store_text):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    lake = tmp_path / "lake"
    cfg = ServeConfig(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "registry"), reload_s=0,
                      lake=str(lake), lake_flush_s=0.2, store_text=store_text, key_rpm=None)
    with LiveServer(cfg) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        ids = [client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": q}]).id
               for q, _ in ITEMS[:3]]
        server.engine.writer.flush()
    rows = [{"question": ITEMS[0][0], "answer": ITEMS[0][1], "domain": "math"},        # by text or hash
            {"id": ids[1], "question": ITEMS[1][0], "answer": ITEMS[1][1], "domain": "math"},   # by response id
            {"question": ITEMS[4][0], "answer": ITEMS[4][1], "domain": "math"}]       # never served
    labels = _labels(tmp_path, rows)
    traffic = read_served(str(lake))
    assert traffic.requests == 3
    sel = select_labelled(traffic, str(labels))
    assert [r["answer"] for r in sel.rows] == [ITEMS[0][1], ITEMS[1][1]]

    config = NightlyConfig(pool=str(ROOT / "data/pools/simulated.yaml"), train_questions="gsm8k_train:1",
                           eval_questions="gsm8k_test:1", work_dir=str(tmp_path / "work"), base="unused",
                           night="t1", served_labels=str(labels), served_lake=str(lake))
    night = plan_night(config)
    mixed, note = served_mix(config, night)
    assert "3 served requests" in note and "2 distinct labelled questions" in note
    mix = load_questions(mixed.train_questions)
    assert [q.gold for q in mix[:2]] == [ITEMS[0][1], ITEMS[1][1]] and mix[2].dataset == "gsm8k_train"
    # the first iteration's window starts with the served questions
    from conductor.run.nightly import iteration_rollout

    first = iteration_rollout(mixed, night, 0, "uri", "ck")
    assert load_questions(first.questions, limit=first.limit)[0].gold == ITEMS[0][1]
    # a resumed night reuses its selection, whatever the lake holds now
    (lake).rename(tmp_path / "lake-moved")
    again, note = served_mix(config, night)
    assert again.train_questions == mixed.train_questions and "reusing" in note


def test_no_labels_configured_leaves_the_mix_alone(tmp_path):
    config = NightlyConfig(pool=str(ROOT / "data/pools/simulated.yaml"), train_questions="gsm8k_train:1",
                           eval_questions="gsm8k_test:1", work_dir=str(tmp_path), base="unused")
    assert served_mix(config, plan_night(config)) == (config, "")


def test_nightly_refuses_a_missing_labels_file_in_one_line(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "night.yaml"
    cfg.write_text(f"pool: {ROOT / 'data/pools/simulated.yaml'}\ntrain_questions: gsm8k_train:1\n"
                   f"eval_questions: gsm8k_test:1\nwork_dir: {tmp_path / 'w'}\nbase: Org/Model\n"
                   f"served_labels: {tmp_path / 'nope.jsonl'}\n")
    r = subprocess.run([sys.executable, "-m", "conductor", "nightly", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: served_labels {tmp_path / 'nope.jsonl'}: no such file "
                                             "(a labels file: JSONL, CSV or Parquet with question and answer)"]


def test_11_two_labels_that_contradict_for_one_served_question_are_refused(tmp_path):
    from conductor.data.datasets import DatasetError
    from conductor.data.served import ServedTraffic, redaction_mark, select_labelled

    traffic = ServedTraffic.of([("served/r-1", redaction_mark("What is 2+2?")), ("served/r-2", "Name a colour")])
    labels = tmp_path / "labels.jsonl"
    rows = [{"question": "What is 2+2?", "answer": "4"}, {"question": "Name a colour", "answer": "red"},
            {"question": "What is 2+2?", "answer": "4"}]            # a repeat: kept once
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sel = select_labelled(traffic, str(labels))
    assert [r["answer"] for r in sel.rows] == ["4", "red"]
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows + [{"question": "What is 2+2?", "answer": "5"}]))
    with pytest.raises(DatasetError, match=r"labels\.jsonl:4: .*line 1 .*'4' there, '5' here"):
        select_labelled(traffic, str(labels))
    labels.write_text(json.dumps({"id": "chatcmpl-r-2", "question": "Name a colour", "answer": "red"}) + "\n"
                      + json.dumps({"id": "r-2", "question": "name a colour", "answer": "blue"}) + "\n")
    with pytest.raises(DatasetError, match=r"labels\.jsonl:2: "):
        select_labelled(traffic, str(labels))
