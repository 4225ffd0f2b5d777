"""The code's shape holds: modules import one way, none imports the spine, and the spine stays small."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest
from conftest import POSTGRES_FIXTURES, ROOT

SPINE = "solos_memory"
ENTRY_POINTS = {SPINE, "pyz_build"}  # the service, and the builder whose __main__ stub starts it
SPINE_MAX_LINES = 1400  # config, table assembly, transport and CLI; capabilities live in modules of their own


@functools.cache  # parsed once per run: the shape tests are in the edit loop
def modules_in(folder: Path) -> dict[str, set[str]]:
    """Each module of one folder, and the modules of that folder it imports anywhere (functions too)."""
    names = {path.stem for path in folder.glob("*.py")}
    found = {}
    for path in folder.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        found[path.stem] = (imported & names) - {path.stem}
    return found


def project_modules() -> dict[str, set[str]]:
    """Each top-level module of the project, and the project modules it imports."""
    return modules_in(ROOT)


def first_cycle(graph: dict[str, set[str]]) -> str | None:
    """An import cycle of the graph, as "a -> b -> a", or None."""
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> str | None:
        if name in path:
            return " -> ".join((*path[path.index(name) :], name))
        if name in done:
            return None
        for imported in sorted(graph.get(name, ())):
            if cycle := visit(imported, (*path, name)):
                return cycle
        done.add(name)
        return None

    return next((cycle for name in sorted(graph) if (cycle := visit(name, ()))), None)


def test_no_module_but_the_entry_points_imports_the_spine():
    importers = {name for name, imported in project_modules().items() if SPINE in imported}
    assert importers <= ENTRY_POINTS - {SPINE}, f"{sorted(importers - ENTRY_POINTS)} import the spine"


def test_project_imports_have_no_cycle():
    assert first_cycle(project_modules()) is None, f"import cycle: {first_cycle(project_modules())}"


def test_bench_scripts_import_each_other_without_a_cycle():
    """bench/ is on sys.path when its scripts run, so they import each other by bare name; what two of them share
    lives in a module both import (harness, locomo_data, locomo_service, ...), never in a loop between them."""
    graph = modules_in(ROOT / "bench")
    assert graph["locomo"] >= {"locomo_service", "relevance_fit"} and "locomo_service" in graph["relevance_fit"]
    assert first_cycle(graph) is None, f"import cycle in bench/: {first_cycle(graph)}"


def test_the_store_imports_only_solos_errors():
    assert project_modules()["solos_store"] == {"solos_errors"}
    assert project_modules()["solos_errors"] == set()


def test_every_query_is_a_method_the_second_store_overrides():
    """One mechanism for the second store: queries are methods of solos_store.Queries (PostgreSQL's PgQueries
    overrides them, so mypy checks each override), reached as store.queries; never a module function looked up
    per connection (`on(conn)`) or by name (`query("…")`), which mypy cannot see."""
    found = [
        f"{path.name}:{number}"
        for path in sorted(ROOT.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"(?<![\w.])on\(|\bquery\(\"", line)
    ]
    assert not found, f'on( or query(" in {found}'


def test_the_client_and_the_hermes_plugin_never_import_the_service():
    modules = project_modules()
    for name in ("solos_client", "solos_hermes", "solos_langgraph"):
        assert modules[name] <= {"solos_client"}, f"{name} imports {modules[name]}"


def test_the_spine_stays_small():
    lines = len((ROOT / f"{SPINE}.py").read_text().splitlines())
    assert lines <= SPINE_MAX_LINES, f"{SPINE}.py is {lines} lines"


def test_the_archive_holds_every_module_its_modules_import():
    """A module the .pyz's code imports (lazily too) but pyz_build leaves out fails only where it is reached:
    solos_pg_keyword, left out, made `solos-memory.pyz serve --db postgresql://...` exit with ModuleNotFoundError."""
    import pyz_build

    graph = project_modules()
    shipped = {name.removesuffix(".py") for name in (*pyz_build.REQUIRED_FILES, pyz_build.EMBEDDER)}
    shipped &= set(graph)
    imported = set().union(*(graph[name] for name in shipped))
    assert imported <= shipped, f"the archive lacks {sorted(imported - shipped)}"


def defined_functions(module: str) -> set[str]:
    """The functions and classes a module defines at its top level."""
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name for node in tree.body if isinstance(node, kinds)}


def test_recall_lives_in_solos_recall():
    """The recall pipeline is solos_recall's (its plan solos_rank's, which ranking takes typed), not the spine's."""
    pipeline = {"op_recall_memory", "plan_recall", "gather", "rank", "present", "Gathered"}
    assert pipeline <= defined_functions("solos_recall")
    assert not (pipeline | {"RecallPlan"}) & defined_functions(SPINE)
    assert "RecallPlan" in defined_functions("solos_rank")
    assert importlib.import_module(SPINE).OPERATIONS["recall"].function.__module__ == "solos_recall"


def is_operation_row(node: ast.AST) -> bool:
    """An `Operation(...)` call (or `solos_operations.Operation(...)`)."""
    if not isinstance(node, ast.Call):
        return False
    called = node.func
    return (isinstance(called, ast.Name) and called.id == "Operation") or (
        isinstance(called, ast.Attribute) and called.attr == "Operation"
    )


def test_every_operation_row_is_declared_one_way():
    """Each module's rows are `Operation(...)` literals in its module-level OPERATION_ROWS tuple, nowhere else,
    and the spine's table is exactly those rows."""
    declaring = []
    for path in sorted(ROOT.glob("*.py")):
        tree = ast.parse(path.read_text())
        in_rows: set[int] = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "OPERATION_ROWS" for t in node.targets):
                assert isinstance(node.value, ast.Tuple), f"{path.name}: OPERATION_ROWS is not a tuple literal"
                assert all(map(is_operation_row, node.value.elts)), f"{path.name}: OPERATION_ROWS holds a non-row"
                in_rows |= {id(element) for element in node.value.elts}
        stray = [node.lineno for node in ast.walk(tree) if is_operation_row(node) and id(node) not in in_rows]
        assert not stray, f"{path.name} builds Operation rows outside OPERATION_ROWS, lines {stray}"
        if in_rows:
            declaring.append(path.stem)
    rows = [row for name in declaring for row in importlib.import_module(name).OPERATION_ROWS]
    table = importlib.import_module(SPINE).OPERATIONS
    assert sorted(row.name for row in rows) == sorted(table), f"declared in {declaring}"
    assert all(table[row.name] is row for row in rows)


def test_every_test_that_reaches_a_postgresql_server_is_marked_slow(request: pytest.FixtureRequest):
    """`make quick` (-m "not slow") starts no server: conftest's hook marks the tests that reach one."""
    items = request.session.items
    reaching = [item for item in items if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ()))]
    unmarked = [item.nodeid for item in reaching if item.get_closest_marker("slow") is None]
    assert not unmarked, f"these reach PostgreSQL but are not slow: {unmarked}"


# What DEVELOPERS.md's layout table calls a module's imports, as module names.
IMPORT_PHRASES = {"the store": "solos_store", "the validation rules": "solos_validation", "the bounds": "solos_bounds"}


def said_imports(phrase: str) -> set[str] | None:
    """The project modules an "imports ..." phrase allows: none for "nothing", the named ones for "only ..." or a
    list; None for a phrase that limits nothing ("imports it", "imports `x` lazily")."""
    if phrase.startswith("nothing"):
        return set()
    if not (phrase.startswith("only ") or phrase.startswith("the store,")):
        return None
    named = set(re.findall(r"`(solos_\w+|mcp_bridge)`", phrase))
    return named | {module for words, module in IMPORT_PHRASES.items() if words in phrase}


def test_the_developers_layout_says_truly_what_each_module_imports():
    """Each "imports only ..." / "imports nothing ..." in the layout table holds for the real import graph (the
    store's names include solos_errors, which it re-exports)."""
    graph, wrong = project_modules(), []
    for line in (ROOT / "DEVELOPERS.md").read_text().splitlines():
        row = re.match(r"\| `(\w+)\.py` \| (.*) \|$", line.strip())
        if not row or row.group(1) not in graph:
            continue
        for phrase in re.findall(r"\bimports ([^;|]*)", row.group(2)):
            allowed = said_imports(phrase)
            if allowed is not None and "solos_store" in allowed:
                allowed.add("solos_errors")
            if allowed is not None and not graph[row.group(1)] <= allowed:
                wrong.append(f"{row.group(1)}: says 'imports {phrase[:60]}', imports {sorted(graph[row.group(1)])}")
    assert not wrong, "\n".join(wrong)


def test_no_test_module_imports_another():
    """Helpers shared by test modules live in conftest: importing one test module from another runs its module
    code twice under two names and hides what the suite shares."""
    test_modules = {path.stem for path in (ROOT / "tests").glob("test_*.py")}
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                imported = [node.module or ""]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.name}:{node.lineno} imports {name}" for name in imported if name in test_modules]
    assert not found, found
