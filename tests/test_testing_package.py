"""The provider emulator is a test double (issue #37, item 4): it lives in ``conductor.testing``, which runtime
code never imports. The one exception is the ``conductor emulator`` command, which imports it lazily inside the
command (it needs the dev extra)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {("conductor/cli/exec_cmd.py", "emulator")}   # (file, function) that may import it, lazily


def _imports_of_testing(path: Path) -> list[tuple[str | None, int]]:
    """(enclosing function or None for module level, line) of every import of conductor.testing in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str | None, int]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            mods: list[str] = []
            if isinstance(child, ast.Import):
                mods = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module:
                mods = [child.module]
            if any(m == "conductor.testing" or m.startswith("conductor.testing.") for m in mods):
                found.append((func, child.lineno))
            visit(child, name)

    visit(tree, None)
    return found


def test_runtime_code_never_imports_the_testing_package():
    offenders = []
    for path in sorted((ROOT / "conductor").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("conductor/testing/"):
            continue
        for func, line in _imports_of_testing(path):
            if (rel, func) not in ALLOWED:
                offenders.append(f"{rel}:{line} (in {func or 'module scope'})")
    assert not offenders, offenders


def test_the_emulator_command_still_imports_it_lazily():
    assert [func for func, _ in _imports_of_testing(ROOT / "conductor/cli/exec_cmd.py")] == ["emulator"]
