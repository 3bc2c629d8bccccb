"""The dependency rules of the runtime library, checked on its source with ``ast`` (nothing is imported).

Rules (docs/design.md, "Modules"):

* **Pure modules do no I/O.** The modules in :data:`PURE` import only the standard
  library's computation modules in :data:`PURE_STDLIB`, ``zstandard`` (in-memory
  compression) and other pure modules.  Imports under ``if TYPE_CHECKING:`` are
  type names only and are not checked.  The exceptions are listed in
  :data:`PURE_ALLOWANCES`, each with its reason, down to the imported names.
* **No import cycle** among fastrecover modules at module level.  Imports inside a
  function run late, so they may close a loop; they are allowed but must be listed
  in :data:`LAZY_IMPORTS`, so a new one is a decision, not an accident.  The
  implicit import of a parent package is not an edge (every module has it).
* **Every exception class lives in fastrecover/errors.py**, so callers find them
  all in one place and all derive from FastRecoverError.
* **No module imports another module's private (``_x``) name.**
"""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fastrecover"

PURE = frozenset(
    f"fastrecover.{name}"
    for name in (
        "ranges",
        "completion_map",
        "codec",
        "recovery",
        "tokens",
        "values",
        "signing",
        "book",
        "partitions",
        "config",
        "child_config",
        "errors",
        "hooks",
        "primary",
        "metrics",
        "latency",
        "tables",
        "secrets",
        "spark.offsets",
        "spark.planning",
        "spark.client_conf",
    )
)

#: Standard-library modules that compute and touch nothing outside the process.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "base64",
        "binascii",
        "bisect",
        "collections",
        "dataclasses",
        "enum",
        "functools",
        "hashlib",
        "heapq",
        "hmac",
        "itertools",
        "json",
        "math",
        "operator",
        "re",
        "typing",
    }
)
PURE_THIRD_PARTY = frozenset({"zstandard"})

#: (pure module, imported module) -> the names it may import from there ("*" = the module itself), and why.
PURE_ALLOWANCES: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("fastrecover.primary", "confluent_kafka"): (
        frozenset({"Message"}),
        "the record type: annotations and its unbound accessors Message.topic/partition; no client, no I/O",
    ),
    ("fastrecover.config", "os"): (
        frozenset({"*"}),
        "os.getcwd()/os.path.join for the default SQLite file, resolved when the config is parsed",
    ),
}

#: Every import inside a function body: (importing module, imported module). Most of the Spark
#: ones keep the store (SQLAlchemy) and the Kafka client out of Spark's per-query unpickling.
LAZY_IMPORTS = frozenset(
    {
        ("fastrecover", "fastrecover.consumer"),  # PEP 562: Consumer is imported on first use
        # the mode's units are imported on a thread while the group join runs (fastrecover/startup.py)
        ("fastrecover.startup", "fastrecover.parallel"),
        # the child's configuration at construction only with fastrecover.child.* overrides: not on every start
        ("fastrecover.startup", "fastrecover.child_config"),
        ("fastrecover.consumer", "fastrecover.metrics"),  # metrics() of a mode-off or closed consumer
        # the snapshot types are made at the first metrics() call, not during the mode's import
        ("fastrecover.parallel", "fastrecover.metrics"),
        ("fastrecover.latency", "fastrecover.metrics"),
        ("fastrecover.completion_map", "zstandard"),
        # hashlib loads OpenSSL (2-3 ms): only signed mirrors and unusual cluster ids need it; json only mirrors
        ("fastrecover.codec", "fastrecover.signing"),
        ("fastrecover.codec", "json"),  # 5 ms of the mode's import: only a compressed map needs it
        ("fastrecover.consumer", "fastrecover.recoverer"),  # PEP 562: the RecoveryReport re-export
        ("fastrecover.cli", "fastrecover.rollback"),
        ("fastrecover.cli", "fastrecover.store.sql"),
        ("fastrecover.store_link", "fastrecover.store"),  # open_store pulls in SQLAlchemy: only with the mode on
        ("fastrecover.spark", "fastrecover.spark.ranges"),
        ("fastrecover.spark", "fastrecover.spark.source"),
        ("fastrecover.spark", "importlib"),
        ("fastrecover.spark", "pyspark"),
        ("fastrecover.spark.ranges", "confluent_kafka"),  # the cluster id, asked once when a ranges job is planned
        ("fastrecover.spark.commit_mirror", "fastrecover.errors"),  # the real classes, not by-value copies
        ("fastrecover.spark.commit_mirror", "fastrecover.spark.offsets"),
        ("fastrecover.spark.driver_jvm", "py4j.java_gateway"),  # JVM views: only in the driver, before start()
        ("fastrecover.spark.driver_jvm", "py4j.protocol"),
        ("fastrecover.spark.foreach_batch", "pyspark.sql"),
        ("fastrecover.spark.jvm", "fastrecover.spark.state"),
        ("fastrecover.spark.jvm", "fastrecover.store"),
        ("fastrecover.spark.jvm", "os"),
        ("fastrecover.spark.jvm", "pyspark"),
        ("fastrecover.spark.jvm", "pyspark.sql"),
        ("fastrecover.spark.kafka", "confluent_kafka"),
        ("fastrecover.spark.kafka", "confluent_kafka.admin"),
        ("fastrecover.spark.kafka", "pyarrow"),
        ("fastrecover.spark.options", "os"),
        ("fastrecover.spark.source", "fastrecover.spark.kafka"),
        ("fastrecover.spark.source", "fastrecover.spark.state"),
        ("fastrecover.spark.source", "fastrecover.store"),
        ("fastrecover.spark.source", "pyspark.sql.pandas.types"),
        ("fastrecover.store.writes", "sqlalchemy.dialects.postgresql"),  # only a PostgreSQL store needs it
        ("fastrecover.store.schema", "alembic"),
        ("fastrecover.store.schema", "alembic.config"),
        ("fastrecover.store.schema", "alembic.script"),
        ("fastrecover.store.schema", "alembic.util"),
    }
)


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a submodule when ``from pkg import submodule``)
    names: tuple[str, ...]  # names taken from it; ("*",) for ``import x``
    lazy: bool  # inside a function body
    type_only: bool  # under ``if TYPE_CHECKING:``
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str, path: Path) -> Iterator[Import]:
    def walk(body: list[ast.stmt], lazy: bool, type_only: bool) -> Iterator[Import]:
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, alias.name, ("*",), lazy, type_only, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, path, node)
                plain = [a.name for a in node.names if f"{target}.{a.name}" not in MODULES]
                for alias in node.names:
                    if f"{target}.{alias.name}" in MODULES:  # from pkg import submodule
                        yield Import(module, f"{target}.{alias.name}", ("*",), lazy, type_only, node.lineno)
                if plain:
                    yield Import(module, target, tuple(plain), lazy, type_only, node.lineno)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, lazy, True)
                yield from walk(node.orelse, lazy, type_only)
            else:
                inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list):
                        yield from walk(
                            [s for s in sub if isinstance(s, ast.stmt)] + _handler_bodies(sub), inner, type_only
                        )

    yield from walk(ast.parse(path.read_text(encoding="utf-8")).body, False, False)


def _handler_bodies(items: list[object]) -> list[ast.stmt]:
    """Statements of ``except`` handlers and ``match`` cases, which are not statements themselves."""
    out: list[ast.stmt] = []
    for item in items:
        if isinstance(item, (ast.ExceptHandler, ast.match_case)):
            out.extend(item.body)
    return out


IMPORTS: list[Import] = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _root(name: str) -> str:
    return name.split(".")[0]


def _allowed_in_pure(imp: Import) -> bool:
    if imp.target in PURE or _root(imp.target) in PURE_STDLIB | PURE_THIRD_PARTY:
        return True
    allowed = PURE_ALLOWANCES.get((imp.source, imp.target))
    return allowed is not None and ("*" in allowed[0] or set(imp.names) <= allowed[0])


# ------------------------------------------------------------------------------------------ rules


def test_the_checker_sees_the_library() -> None:
    """Guards the rules below against passing vacuously (wrong root, parser that finds nothing)."""
    assert MODULES.keys() >= PURE
    assert {"fastrecover.consumer", "fastrecover.store.sql", "fastrecover.errors"} <= MODULES.keys()
    assert sum(1 for i in IMPORTS if i.target.startswith("fastrecover")) > 50


def test_pure_modules_import_no_io() -> None:
    bad = [
        f"{i.source}:{i.line} imports {i.target} ({', '.join(i.names)})"
        for i in IMPORTS
        if i.source in PURE and not i.type_only and not _allowed_in_pure(i)
    ]
    assert not bad, "pure modules must not do I/O:\n" + "\n".join(bad)


def test_every_allowance_is_still_needed() -> None:
    used = {(i.source, i.target) for i in IMPORTS if i.source in PURE and not i.type_only}
    stale = set(PURE_ALLOWANCES) - used
    assert not stale, f"allowances no import needs any more (remove them): {sorted(stale)}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycle_at_module_level() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if not i.lazy and not i.type_only and i.target in MODULES and i.target != i.source:
            graph[i.source].add(i.target)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_lazy_imports_are_the_listed_ones() -> None:
    lazy = {(i.source, i.target) for i in IMPORTS if i.lazy}
    assert lazy == LAZY_IMPORTS, (
        f"new lazy imports (list them in LAZY_IMPORTS if intended): {sorted(lazy - LAZY_IMPORTS)}; "
        f"listed but gone: {sorted(LAZY_IMPORTS - lazy)}"
    )


def _exception_names() -> set[str]:
    names = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    errors = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    names |= {n.name for n in ast.walk(errors) if isinstance(n, ast.ClassDef)}
    return names


def _looks_like_exception(base: ast.expr, known: set[str]) -> bool:
    name = ast.unparse(base).split(".")[-1]
    return name in known or name.endswith(("Error", "Exception", "Warning"))


def test_exception_classes_live_in_errors_py() -> None:
    known = _exception_names()
    stray = [
        f"{module}:{node.lineno} class {node.name}"
        for module, path in MODULES.items()
        if module != "fastrecover.errors"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and any(_looks_like_exception(b, known) for b in node.bases)
    ]
    assert not stray, "exception classes outside fastrecover/errors.py:\n" + "\n".join(stray)


def test_every_error_is_a_fastrecover_error() -> None:
    tree = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    classes = {n.name: [ast.unparse(b) for b in n.bases] for n in tree.body if isinstance(n, ast.ClassDef)}

    def ours(name: str) -> bool:
        return name == "FastRecoverError" or any(ours(b) for b in classes.get(name, []) if b in classes)

    assert [n for n in classes if not ours(n)] == []


def test_no_private_name_is_imported_across_modules() -> None:
    bad = [
        f"{i.source}:{i.line} imports {name} from {i.target}"
        for i in IMPORTS
        if i.target in MODULES and i.target != i.source
        for name in i.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------ runtime vs tools

TOOLS = (
    "fastrecover/bench",
    "fastrecover/chaos",
    "fastrecover/testing",
    "fastrecover/demo.py",
    "fastrecover/spark/bench.py",
)


@pytest.mark.parametrize("path", TOOLS)
def test_tools_are_not_in_the_runtime_package(path: str) -> None:
    assert not (REPO / path).exists(), f"{path} belongs to the fastrecover-tools distribution (tools/)"


def test_no_runtime_module_imports_the_tools() -> None:
    bad = [f"{i.source}:{i.line} imports {i.target}" for i in IMPORTS if _root(i.target) == "fastrecover_tools"]
    # the CLI reaches them through importlib only, so a wheel without them still runs
    assert bad == []


def test_wheel_config_ships_the_library_and_excludes_the_tools() -> None:
    tomllib = pytest.importorskip("tomllib")
    runtime = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    wheel = runtime["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["fastrecover"]
    assert set(TOOLS) <= set(wheel["exclude"])
    assert "tools" in runtime["tool"]["hatch"]["build"]["targets"]["sdist"]["exclude"]
    assert not any("tools" in dep or "psutil" in dep for dep in runtime["project"]["dependencies"])

    tools = tomllib.loads((REPO / "tools" / "pyproject.toml").read_text(encoding="utf-8"))
    assert tools["project"]["name"] == "fastrecover-tools"
    assert tools["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["fastrecover_tools"]
    shipped = REPO / "tools" / "fastrecover_tools"
    for part in ("bench", "chaos", "testing", "demo.py", "spark_bench.py", "testing/kafka-pom.xml"):
        assert (shipped / part).exists(), part


def test_a_consumer_with_the_mode_off_imports_no_sqlalchemy() -> None:
    """SQLAlchemy costs ~0.25 s to import: a drop-in with the mode off must not pay it (nor ``import fastrecover``)."""
    code = (
        "import sys, fastrecover, fastrecover.consumer, fastrecover.store\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic'))\n"
        "assert not loaded, loaded\n"
        "fastrecover.store.open_store  # the first use loads it\n"
        "assert 'sqlalchemy' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_name_of_the_store_package_resolves() -> None:
    import fastrecover.store as store

    for name in store.__all__:
        assert getattr(store, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = store.no_such_name  # type: ignore[attr-defined]
