"""Load for `conductor serve` tests and bench/serve.py: arithmetic questions with their gold answers and the simulated
pool that knows them (``options.gold_path``), so a served answer can be graded; a free loopback port."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import yaml

from conductor.resources import data_path


def questions(n: int, offset: int = 0) -> list[tuple[str, str]]:
    """(question, gold) arithmetic items, distinct for distinct i."""
    out = []
    for i in range(offset, offset + n):
        a, b = 17 + i * 7 % 89, 5 + i * 13 % 61
        out.append((f"Question {i}: a shop sells {a} apples in the morning and {b} in the afternoon. "
                    "How many apples does it sell in total? Give the final answer in <answer></answer> tags.",
                    str(a + b)))
    return out


def simulated_pool(tmp: Path, items: list[tuple[str, str]], latency_s: float = 0.0,
                   skills: float | None = None) -> Path:
    """data/pools/simulated.yaml with a gold file for ``items`` (and a fixed latency per call)."""
    gold = tmp / "gold.jsonl"
    gold.write_text("".join(json.dumps({"question": q, "gold": g, "domain": "math"}) + "\n" for q, g in items))
    doc = yaml.safe_load(data_path("pools", "simulated.yaml").read_text())
    for w in doc["workers"]:
        w["options"]["gold_path"] = str(gold)
        w["options"]["latency_s"] = latency_s
        if skills is not None:
            w["options"]["skills"] = {"default": skills, "math": skills}
        w["limits"]["max_concurrency"] = 256
    path = tmp / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


