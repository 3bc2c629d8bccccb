"""Size limits of the runtime library: no module over 400 lines, ``class Consumer`` under 300.

A module that does one job reads in one sitting; past these sizes the modules had
drifted into several jobs each, unnoticed, because nothing checked (issue 33).  The
limits cover every module of the ``fastrecover`` package, recursively; the tools
(``tools/``) and the tests are not part of it.  Lines are counted as ``wc -l`` counts
them (newline characters), and a test holds the two counts together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fastrecover"

#: at most this many lines in any module of the runtime package
MODULE_MAX_LINES = 400
#: (module, class) -> the class must have fewer lines than this, from its ``class`` line to its last
CLASS_BELOW_LINES = {("fastrecover/consumer.py", "Consumer"): 300}

#: Modules still over a limit while another branch splits them; their limits are skipped until then.
#: Each entry must still break a limit (test_every_module_being_split_is_still_over_a_limit), so the
#: list empties itself as the splits land: remove a module here as soon as it fits.
_BEING_SPLIT: set[str] = set()

MODULES = sorted(p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py"))


def line_count(path: str) -> int:
    """Lines as ``wc -l`` counts them: newline characters (a last line without one is not counted)."""
    return (REPO / path).read_bytes().count(b"\n")


def class_lines(path: str, name: str) -> int:
    """Lines of the top-level class ``name`` in ``path``, from its ``class`` line to its last line."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    assert len(found) == 1, f"{path}: expected one top-level class {name}, found {len(found)}"
    node = found[0]
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def violations(path: str) -> list[str]:
    """Every limit ``path`` breaks, each as a sentence naming the size and the limit."""
    out = []
    lines = line_count(path)
    if lines > MODULE_MAX_LINES:
        out.append(f"{path} has {lines} lines (must be at most {MODULE_MAX_LINES})")
    for (module, name), below in CLASS_BELOW_LINES.items():
        if module == path and (size := class_lines(path, name)) >= below:
            out.append(f"class {name} in {path} has {size} lines (must be fewer than {below})")
    return out


def test_the_checker_sees_the_library() -> None:
    """Guards the limits below against passing vacuously (a wrong root, a glob that finds nothing)."""
    assert len(MODULES) > 50
    assert {"fastrecover/consumer.py", "fastrecover/store/sql.py", "fastrecover/spark/controller.py"} <= set(MODULES)
    assert not any(m.startswith(("tools/", "tests/")) for m in MODULES)
    assert {module for module, _ in CLASS_BELOW_LINES} <= set(MODULES)


def test_line_count_agrees_with_wc() -> None:
    """The count here is the one a reviewer gets from ``wc -l``, file by file."""
    done = subprocess.run(["wc", "-l", *MODULES], cwd=REPO, capture_output=True, text=True, check=True, timeout=60)
    counted = {}
    for row in done.stdout.splitlines():
        number, name = row.split(maxsplit=1)
        if name != "total":
            counted[name] = int(number)
    assert counted == {m: line_count(m) for m in MODULES}


@pytest.mark.parametrize("path", MODULES)
def test_module_is_within_the_limits(path: str) -> None:
    if path in _BEING_SPLIT:
        pytest.skip(f"{path} is being split on another branch (_BEING_SPLIT)")
    found = violations(path)
    assert not found, "; ".join(found)


def test_every_module_being_split_is_still_over_a_limit() -> None:
    """A module listed in ``_BEING_SPLIT`` that already fits (or is gone) must leave the list."""
    stale = [path for path in sorted(_BEING_SPLIT) if path not in MODULES or not violations(path)]
    assert stale == [], f"within the limits now: remove them from _BEING_SPLIT: {stale}"


def test_the_limits_catch_an_oversized_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks themselves: one line over a limit is caught, a module at the limit is not."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "at_limit.py").write_text("x = 1\n" * MODULE_MAX_LINES, encoding="utf-8")
    (tmp_path / "over.py").write_text("x = 1\n" * (MODULE_MAX_LINES + 1), encoding="utf-8")
    assert violations("at_limit.py") == []
    assert violations("over.py") == [f"over.py has {MODULE_MAX_LINES + 1} lines (must be at most {MODULE_MAX_LINES})"]
    body = "    x = 1\n" * 298
    monkeypatch.setattr(sys.modules[__name__], "CLASS_BELOW_LINES", {("small.py", "C"): 300, ("big.py", "C"): 300})
    (tmp_path / "small.py").write_text("class C:\n" + body, encoding="utf-8")  # 299 lines
    (tmp_path / "big.py").write_text("class C:\n" + body + "    y = 2\n", encoding="utf-8")  # 300 lines
    assert violations("small.py") == []
    assert violations("big.py") == ["class C in big.py has 300 lines (must be fewer than 300)"]
