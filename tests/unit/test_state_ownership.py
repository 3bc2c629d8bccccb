"""Every attribute of the library's objects has one owner: the module of the class that declares it.

Checked on the source with ``ast`` (nothing is imported), in the spirit of test_architecture.py.
An attribute is *declared* by a class that sets ``self.x`` in its ``__init__``, annotates ``x`` in
its body (dataclass fields) or lists it in ``__slots__``; the declaring class's module owns it.  A
*write* is an assignment to ``<anything>.x`` (``=``, augmented, annotated, unpacking), a
``del <anything>.x`` or ``del <anything>.x[...]``, a ``<anything>.x[...] = ...``, or a call of a
mutating method (``append``, ``update``, ``pop``, ...) on ``<anything>.x`` where ``x`` was declared
as a container.  A write from a module that declares no attribute of that name is a violation:
another unit must ask the owner through a method.  So units talk through methods and no module
reaches into another's fields (the mixin chain of issue 33 wrote one object's fields from four).

Limits, on purpose: attributes are told apart by name (a write to ``x`` from a module that declares
an ``x`` of its own is not checked), and a write through a local alias of a container
(``items = obj.items; items.append(...)``) is not seen.  Names declared nowhere in the package
(``TopicPartition.offset``) are not a unit's and not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fastrecover"

#: methods that change the container they are called on
MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "update",
        "pop",
        "popitem",
        "remove",
        "discard",
        "add",
        "clear",
        "setdefault",
        "sort",
        "reverse",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
    }
)
_CONTAINER_CALLS = frozenset({"list", "dict", "set", "deque", "defaultdict", "OrderedDict", "Counter"})
_CONTAINER_NODES = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)

#: (class, attribute): a plain record one module makes and another moves, by design, and why.
RECORDS: dict[tuple[str, str], str] = {
    ("fastrecover.book.RangeWork", "next_offset"): "the child's read order: the child moves its delivery cursor",
    ("fastrecover.book.RangeWork", "fetch_next"): "the child's read order: the child's fetch position",
    ("fastrecover.book.RangeWork", "fetched_all"): "the child's read order: the child saw the range's end",
    ("fastrecover.book.RangeWork", "skip"): "the child's read order: offsets it delivered out of order",
    ("fastrecover.book.RangeWork", "token_id"): "the child's read order: a store token took over an early range",
    ("fastrecover.batches.Segment", "pos"): "a buffered fetch: the child takes records from its front",
    ("fastrecover.store.updates.CommitResult", "tokens"): "a store transaction's result, filled by its statements",
    ("fastrecover.store.updates.CommitResult", "fenced"): "a store transaction's result, filled by its statements",
    (
        "fastrecover.recovery_writes.Recovered",
        "floors",
    ): "a recovery's outcome: the writer fills it, the recoverer trims it",
    (
        "fastrecover.recovery_writes.Recovered",
        "to_mirror",
    ): "a recovery's outcome: the writer fills it, the recoverer trims it",
    (
        "fastrecover.recovery_writes.Recovered",
        "renamed",
    ): "a recovery's outcome: the recoverer names the store tokens that took over early ranges",
    (
        "fastrecover.recovery_writes.Recovered",
        "dropped",
    ): "a recovery's outcome: the recoverer names the early ranges no store token took over",
    (
        "fastrecover.recovery_writes.Recovered",
        "moved",
    ): "a recovery's outcome: the recoverer names the primaries a late jump moves, once their tokens are written",
}


@dataclass(frozen=True)
class Declared:
    module: str
    cls: str
    container: bool
    frozen: bool = False  # a frozen dataclass's field: no assignment can be to it (Python refuses one)


@dataclass(frozen=True)
class Write:
    module: str
    line: int
    attr: str
    how: str


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_container(value: ast.expr | None, annotation: ast.expr | None) -> bool:
    if isinstance(value, _CONTAINER_NODES):
        return True
    if isinstance(value, ast.Call):
        name = ast.unparse(value.func).split(".")[-1]
        if name in _CONTAINER_CALLS:
            return True
        if name == "field" and any(k.arg == "default_factory" for k in value.keywords):
            return True
    if annotation is not None:
        head = ast.unparse(annotation).split("[")[0].split(".")[-1].strip("\"'")
        return head in {"list", "dict", "set", "deque", "defaultdict", "MutableMapping", "MutableSequence"}
    return False


def declarations(sources: dict[str, str]) -> dict[str, list[Declared]]:
    """Attribute name -> the classes (and modules) that declare it."""
    out: dict[str, list[Declared]] = {}
    for module, source in sources.items():
        for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
            qual = f"{module}.{cls.name}"
            frozen = any(_is_frozen_dataclass(d) for d in cls.decorator_list)
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    container = _is_container(stmt.value, stmt.annotation)
                    out.setdefault(stmt.target.id, []).append(Declared(module, qual, container, frozen))
                elif isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
                ):
                    for elt in ast.walk(stmt.value):
                        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                            out.setdefault(elt.value, []).append(Declared(module, qual, False))
                elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                    for node in ast.walk(stmt):
                        for target, value, annotation in _assignments(node):
                            for attr in _self_attrs(target):
                                container = _is_container(value, annotation)
                                out.setdefault(attr, []).append(Declared(module, qual, container))
    return out


def _is_frozen_dataclass(decorator: ast.expr) -> bool:
    """``@dataclass(frozen=True)``, or fastrecover.values' ``@value`` (always frozen)."""
    if isinstance(decorator, ast.Name | ast.Attribute) and ast.unparse(decorator).split(".")[-1] == "value":
        return True
    return (
        isinstance(decorator, ast.Call)
        and ast.unparse(decorator.func).split(".")[-1] == "dataclass"
        and any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value for k in decorator.keywords)
    )


def _assignments(node: ast.AST) -> Iterator[tuple[ast.expr, ast.expr | None, ast.expr | None]]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield target, node.value, None
    elif isinstance(node, ast.AnnAssign):
        yield node.target, node.value, node.annotation
    elif isinstance(node, ast.AugAssign):
        yield node.target, node.value, None


def _self_attrs(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        yield target.attr
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _self_attrs(elt)


def _targets(target: ast.expr) -> Iterator[tuple[ast.Attribute, str]]:
    """Attribute nodes written by an assignment to ``target`` (and how: set, or an item of it)."""
    if isinstance(target, ast.Attribute):
        yield target, "assigned"
    elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute):
        yield target.value, "item assigned"
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _targets(elt)


def writes(module: str, source: str) -> Iterator[Write]:
    for node in ast.walk(ast.parse(source)):
        for target, _value, _annotation in _assignments(node):
            for attr, how in _targets(target):
                yield Write(module, attr.lineno, attr.attr, how)
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    yield Write(module, node.lineno, target.attr, "deleted")
                elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute):
                    yield Write(module, node.lineno, target.value.attr, "item deleted")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Attribute)
        ):
            yield Write(module, node.lineno, node.func.value.attr, f".{node.func.attr}()")


def violations(sources: dict[str, str]) -> list[str]:
    """Writes of a declared attribute from a module that declares no attribute of that name."""
    declared = declarations(sources)
    bad = []
    for module, source in sources.items():
        for w in writes(module, source):
            owners = declared.get(w.attr)
            if not owners or module in {d.module for d in owners}:
                continue
            if w.how.startswith(".") or w.how.startswith("item"):
                owners = [d for d in owners if d.container]  # else a unit's method (child.add, book.remove)
            else:
                owners = [d for d in owners if not d.frozen]
            if not owners or any((d.cls, w.attr) in RECORDS for d in owners):
                continue
            where = ", ".join(sorted({d.cls for d in owners}))
            bad.append(f"{module}:{w.line} {w.attr} {w.how}, owned by {where}")
    return bad


def package_sources() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


# ------------------------------------------------------------------------------------------ tests


def test_the_checker_sees_the_library() -> None:
    """Guards the rule below against passing vacuously."""
    declared = declarations(package_sources())
    assert {"fast_calls", "deferred", "routes", "child_runs", "settled_keys", "untracked"} <= declared.keys()
    assert any(d.module == "fastrecover.steady" for d in declared["fast_calls"])
    assert sum(1 for _ in writes("fastrecover.commits", package_sources()["fastrecover.commits"])) > 5


def test_no_module_writes_another_units_attributes() -> None:
    bad = violations(package_sources())
    assert not bad, "attributes written outside their owner's module (ask the owner through a method):\n" + "\n".join(
        bad
    )


def test_every_record_allowance_is_still_needed() -> None:
    sources = package_sources()
    declared = declarations(sources)
    used = {
        (d.cls, w.attr)
        for module, source in sources.items()
        for w in writes(module, source)
        for d in declared.get(w.attr, [])
        if module != d.module
    }
    assert set(RECORDS) <= used, f"allowances no write needs any more: {sorted(set(RECORDS) - used)}"


PLANTED = {
    "pkg.owner": """
class Unit:
    slots_only: int
    def __init__(self) -> None:
        self.count = 0
        self.items: list[int] = []
        self.index = {}
        self.helper = Helper()

    def bump(self) -> None:
        self.count += 1
        self.items.append(1)
""",
    "pkg.intruder": """
from pkg.owner import Unit

class Chain(Unit):
    def poke(self) -> None:
        self.count = 5

def reach(unit: Unit) -> None:
    unit.count += 1
    unit.items.append(2)
    unit.index["k"] = 1
    del unit.items[0]
    unit.items, other = [], 1
    unit.helper.add(3)
    unit.slots_only = 1
""",
}


def test_the_checker_catches_a_planted_violation() -> None:
    bad = violations(PLANTED)
    lines = sorted(int(b.split(":")[1].split()[0]) for b in bad)
    assert all(b.startswith("pkg.intruder:") for b in bad), bad
    # self.count in a subclass of another module, +=, .append, item set, del item, unpacking, annotated field;
    # not helper.add(): a unit's method, not a container's
    assert lines == [6, 9, 10, 11, 12, 13, 15], bad
    assert violations({"pkg.owner": PLANTED["pkg.owner"]}) == []
