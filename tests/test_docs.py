"""The docs stay true: every operation documented, the quick start runs as written on a fresh service, every code
name, command, route and flag README.md, DEVELOPERS.md and docs/*.md give exists, and the Configuration table
(docs/operations.md) is the CLI's."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, set_up_commands, zero_install_command

import pyz_build
import solos_client
import solos_memory

README = (ROOT / "README.md").read_text()
OPERATIONS_PAGE = (ROOT / "docs" / "operations.md").read_text()


@pytest.mark.parametrize("name", list(solos_memory.OPERATIONS))
def test_every_operation_is_documented(name):
    op = solos_memory.OPERATIONS[name]
    assert f"| `{name}` | `{op.method} {op.path}` |" in README
    row = next(line for line in README.splitlines() if line.startswith(f"| `{name}` |"))
    for field in op.input_schema["properties"]:
        assert f"`{field}`" in row, f"README's {name} row does not name {field}"
    assert len(op.description) > 40 and op.title


def quick_start_commands() -> str:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```sh\n(.*?)```", section, re.S))


def test_set_up_has_exactly_two_commands_the_service_and_the_tests():
    assert set_up_commands() == ["make serve", "make test"]
    assert zero_install_command() == ["python3", "solos_memory.py", "serve", "--register", "atlas,sol"]


@pytest.mark.slow
def test_quick_start_works_right_after_the_zero_install_set_up_command(tmp_path):
    """Run the README's own commands: the serve line (on a free port) in a fresh folder, then every curl."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    for name in pyz_build.REQUIRED_FILES:  # what the service needs beside it
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    argv = zero_install_command()
    assert argv[:3] == ["python3", "solos_memory.py", "serve"]
    process = subprocess.Popen(
        [sys.executable, *argv[1:], "--port", "0"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        port = json.loads(process.stderr.readline())["port"]
        script = quick_start_commands().replace("localhost:8437", f"localhost:{port}")
        script = script.replace("curl -s", "curl -sS --fail-with-body -w '\\n'")
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        answers = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
        recall = next(a for a in answers if a.get("q") == "when do backups run")
        assert [(r["agent"], r["foreign"]) for r in recall["results"]] == [("atlas", True)]
        floored = {a["q"]: a for a in answers if a.get("min_relevance")}  # the example's floor is the helpers'
        assert {a["min_relevance"] for a in floored.values()} == {solos_client.TURN_MIN_RELEVANCE}
        assert [r["agent"] for r in floored["when do backups run"]["results"]] == ["atlas"]
        assert floored["what port does the gateway use"]["results"] == []
        audit = next(a for a in answers if "reads" in a)
        assert [(r["reader"], r["author"]) for r in audit["reads"]] == [("sol", "atlas")]
        assert (tmp_path / "solos.db").exists()
    finally:
        process.terminate()
        process.wait(timeout=10)


# ==== Every code name the docs give exists ====
#
# What counts as a code name: an inline code span (one pair of backticks, outside fenced blocks) of
# README.md or DEVELOPERS.md that is a Python-style name, or that holds a path into the repository:
#
# - a path under one of the repository's folders (`bench/locomo.py`, `tests/test_setup.py`, also inside a
#   command) or a bare .py/.md/.sql file name must exist (at the root, in tests/ or in bench/);
# - a dotted name (`Store.read`, `solos_rank.fuse`, `Memory.embedder_state()`) whose head is one of the
#   top-level modules or a class defined in one must resolve attribute by attribute: module-level names,
#   class members (methods, class attributes, dataclass fields, `self.x` assigned in a method, inherited
#   from a class of ours); a stdlib head (`http.server`) must import; a lower-case head that is neither
#   (`qdrant.import.left_out`, a key path) must be named in the code part by part, as any snake_case name;
# - an UPPER_CASE name must be defined at module level (`MAX_CONNECTIONS`), or be an environment variable
#   the code reads (`SOLOS_MEMORY_DB`: the code asks for "DB" under its prefix) or a systemd unit's command
#   line does;
# - a CamelCase name must be a class or name defined at module level (`Store`), or a string the code uses
#   (the `Origin` header);
# - a snake_case name with an underscore (`embed_backlog`, `memory_event`, `check_args`) must be named
#   somewhere in the code: an identifier, a string (a JSON key, SQL) or schema.sql; or be built there from a
#   string ending in "_" and such a name (`invalid_fact` from f"invalid_{field}"). Docstrings and comments
#   do not count. Hermes's name for one of our MCP tools (`mcp__solos_memory__recall`) must end in a name.
# Single lower-case words (`recall`, `agent`) are not checked: they are English as often as code; nor are
# Hermes Agent's own names (EXTERNAL) and files the service makes (RUNTIME_FILES).
# "The code" is every top-level module (solos_*.py, mcp_bridge.py, pyz_build.py) and tests/conftest.py
# (`skip_or_fail`), all searched at once, so moving a name between modules keeps the docs true.

DOCS = ("README.md", "DEVELOPERS.md", *(str(page.relative_to(ROOT)) for page in sorted((ROOT / "docs").glob("*.md"))))
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?")
REPO_PATH = re.compile(r"(?<![\w./~-])(?:bench|tests|research|scripts|systemd|models|docs)/[\w./-]*")
CHECKED_FILES = (".py", ".md", ".sql")
MCP_CLIENT_TOOL = re.compile(r"mcp__\w+?__(\w+)")  # how Hermes names an MCP server's tool: the tool must be ours
RUNTIME_FILES = (".db", ".lock", ".yaml", ".json")  # made by the service or Hermes, not in the repository
# Hermes Agent's own names, which the README cites from its source (not ours to define).
EXTERNAL = {"AIAgent", "MemoryManager", "compress_context", "MEMORY.md", "USER.md", "__init__.py"}


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


class CodeIndex:
    """What the top-level modules define, class by class, and every word they name outside docstrings."""

    def __init__(self) -> None:
        self.modules: dict[str, set[str]] = {}  # module -> the names it binds at module level (imports too)
        self.defined: set[str] = set()  # module-level definitions of every module (no imports)
        self.classes: dict[str, list[tuple[set[str], list[str]]]] = {}  # class -> (members, base names)
        self.words: set[str] = set(re.findall(r"\w+", (ROOT / "schema.sql").read_text()))
        self.strings: set[str] = set()
        units = (line for unit in (ROOT / "systemd").iterdir() for line in unit.read_text().splitlines())
        self.unit_words = {word for line in units if not line.startswith("#") for word in re.findall(r"\w+", line)}
        for path in [*sorted(ROOT.glob("*.py")), ROOT / "tests" / "conftest.py"]:
            tree = ast.parse(path.read_text())
            self.modules[path.stem] = set().union(*(bound(node) for node in tree.body))
            self.defined |= set().union(*(bound(node) for node in tree.body if not isinstance(node, IMPORTS)))
            docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]  # module.Class: Class
                    self.classes.setdefault(node.name, []).append((class_members(node), bases))
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    self.strings.add(node.value)
                    self.words |= set(re.findall(r"\w+", node.value))
                else:
                    self.words.add(getattr(node, "id", None) or getattr(node, "attr", None) or named(node) or "")

    def members(self, owner: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """A class's members, with those of its bases that are classes of ours."""
        found: set[str] = set()
        for members, bases in self.classes.get(owner, []):
            found |= members
            for base in set(bases) & set(self.classes) - seen:
                found |= self.members(base, seen | {owner})
        return found

    def problem(self, name: str) -> str | None:
        """Why a code name does not resolve, or None when it does."""
        name = name.removesuffix("()")
        head, *rest = name.split(".")
        if name in EXTERNAL or head in EXTERNAL or name.endswith(RUNTIME_FILES):
            return None
        if name.endswith(CHECKED_FILES):
            found = any((folder / name).exists() for folder in (ROOT, ROOT / "tests", ROOT / "bench", ROOT / "docs"))
            return None if found else "no such file in the repository"
        if (ROOT / name).is_file() or (tool := MCP_CLIENT_TOOL.fullmatch(name)) and tool[1] in self.words:
            return None
        if rest:
            return self.dotted(head, rest)
        if re.fullmatch(r"[A-Z][A-Z0-9_]+", name):
            if {name, name.removeprefix("SOLOS_MEMORY_")} & self.strings or name in self.defined | self.unit_words:
                return None
            return "not defined at module level, nor an environment variable the code reads"
        if name[0].isupper():
            return None if name in self.defined | self.strings else "no class or name of that name"
        if "_" in name.strip("_"):
            return None if name in self.words or self.built(name) else "named nowhere in the code"
        return None

    def built(self, name: str) -> bool:
        """Whether the code builds the name from a string ending in "_" and a name (f"invalid_{field}")."""
        return any(
            name.startswith(prefix) and name.removeprefix(prefix) in self.words
            for prefix in self.words
            if prefix.endswith("_") and prefix.strip("_")
        )

    def dotted(self, head: str, rest: list[str]) -> str | None:
        """Resolve module.name, Class.member, module.Class.member; a stdlib path; or a key path."""
        if head not in self.modules and head not in self.classes:
            if head in sys.stdlib_module_names:
                return None if stdlib_has(head, rest) else "not in the standard library"
            if head[0].isupper():
                return f"{head} is no module or class of ours"
            missing = [part for part in (head, *rest) if part not in self.words]
            return f"{missing} named nowhere in the code" if missing else None
        owner = None if head in self.modules else head
        for part in rest:
            if owner is not None:  # a member's type is unknown: what follows it is not checked
                return None if part in self.members(owner) else f"{owner} has no {part}"
            if part not in self.modules[head]:
                return f"{head} has no {part}"
            if part not in self.classes:
                return None
            owner = part
        return None


IMPORTS = (ast.Import, ast.ImportFrom)


def bound(node: ast.AST) -> set[str]:
    """The names a module- or class-level statement binds."""
    if isinstance(node, IMPORTS):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if name := named(node):
        return {name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {leaf.id for target in filter(None, targets) for leaf in ast.walk(target) if isinstance(leaf, ast.Name)}


def named(node: ast.AST) -> str | None:
    """The name a def, a class, a parameter or a keyword argument gives."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    return node.arg if isinstance(node, ast.arg | ast.keyword) else None


def class_members(node: ast.ClassDef) -> set[str]:
    """Methods, class attributes and dataclass fields, and every `self.x` a method assigns."""
    members = set().union(*(bound(item) for item in node.body))
    for item in ast.walk(node):
        targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
        for leaf in (leaf for target in filter(None, targets) for leaf in ast.walk(target)):
            if isinstance(leaf, ast.Attribute) and getattr(leaf.value, "id", None) == "self":
                members.add(leaf.attr)
    return members


def stdlib_has(module: str, path: list[str]) -> bool:
    """Whether module.path names something in the standard library (a submodule or an attribute)."""
    try:
        target = importlib.import_module(module)
        for part in path:
            target = getattr(target, part) if hasattr(target, part) else importlib.import_module(f"{module}.{part}")
    except ImportError:
        return False
    return True


INDEX = CodeIndex()


def doc_names() -> list[tuple[str, str]]:
    return sorted(
        {(doc, span) for doc in DOCS for span in code_spans((ROOT / doc).read_text()) if NAME.fullmatch(span)}
    )


@pytest.mark.parametrize(("doc", "name"), doc_names())
def test_every_code_name_in_the_docs_exists(doc, name):
    problem = INDEX.problem(name)
    assert problem is None, f"{doc} names `{name}`: {problem}"


def test_every_repository_path_in_the_docs_exists():
    missing = [
        (doc, path)
        for doc in DOCS
        for span in code_spans((ROOT / doc).read_text())
        for path in REPO_PATH.findall(span)
        if not (ROOT / path.rstrip(".,;:")).exists()
    ]
    assert missing == []


def test_the_developers_layout_lists_every_module():
    layout = (ROOT / "DEVELOPERS.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", layout, re.M))
    assert {path.name for path in ROOT.glob("*.py")} - listed == set()


# ==== The Configuration table is the CLI's ====


def configuration_table() -> dict[str, str | None]:
    """docs/operations.md's Configuration rows: flag -> its environment variable (None where it has none)."""
    section = OPERATIONS_PAGE.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if cells := re.match(r"\| `(--[\w-]+)` \| (`(SOLOS_MEMORY_\w+)`)?", line):
            rows[cells[1]] = cells[3]
    return rows


def options(*command: str) -> set[str]:
    """The long options a command's --help lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        solos_memory.main([*command, "--help"])
    return set(re.findall(r"^\s+(?:-\w+, )?(--[\w-]+)", out.getvalue(), re.M)) - {"--help"}


def commands() -> list[str]:
    """The subcommands `solos_memory.py --help` lists, but client (the client's own CLI, not argparse here)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        solos_memory.main(["--help"])
    return [name for name in re.search(r"\{([\w,-]+)\}", out.getvalue())[1].split(",") if name != "client"]


def test_every_flag_in_the_configuration_table_is_an_option():
    known = set().union(*(options(command) for command in commands()))
    table = configuration_table()
    assert "--db" in table and set(table) - known == set()


def test_every_serve_option_is_in_the_configuration_table():
    assert options("serve") - set(configuration_table()) == set()


@pytest.mark.parametrize(("flag", "variable"), [(f, v) for f, v in configuration_table().items() if v])
def test_the_tables_environment_variable_sets_its_flag(flag, variable, monkeypatch):
    command = next(name for name in ("serve", *commands()) if flag in options(name))
    dest = flag.removeprefix("--").replace("-", "_")
    monkeypatch.delenv(variable, raising=False)
    default = getattr(solos_memory.parse_args([command]), dest)
    for value in ("4321", "2", "off", "on"):  # a number suits the numbers and the paths; on/off the switches
        monkeypatch.setenv(variable, value)
        with contextlib.suppress(SystemExit):  # a value the flag refuses: try the next
            if getattr(solos_memory.parse_args([command]), dest) != default:
                return
    pytest.fail(f"{variable} takes neither 4321, 2, off nor on")


# ==== Every command, route and flag the docs give exists ====
#
# Read from the docs' code: inline spans and fenced blocks. A command is a word after one of our programs
# (`solos_memory.py`, `solos-memory.pyz`, their `client`, `solos_client.py`, `$SOLOS`), or after `make`; a route
# is a path after an HTTP method, after the service's address, or a span that is a bare path of ours; a flag is
# every `--option` on a line that runs one of our programs, and every span that is only an option.

SERVICE_PROGRAM = r"(?:solos_memory\.py|solos-memory\.pyz)"
CLIENT_PROGRAM = r"(?:solos_client\.py|\$SOLOS|(?:solos_memory\.py|solos-memory\.pyz) client)"
METHOD_PATH = re.compile(r"\b(GET|POST|PUT|DELETE|PATCH|HEAD) (/[\w./-]*)")
ADDRESS_PATH = re.compile(r"(?:localhost|127\.0\.0\.1):8437(/[\w./-]*)")
SERVICE_PATHS = ("/v1/", "/health", "/mcp", "/metrics", "/openapi.json", "/status")


def code_texts(doc: str) -> list[str]:
    """A doc's inline code spans and the lines of its fenced blocks."""
    text = (ROOT / doc).read_text()
    blocks = re.findall(r"```\w*\n(.*?)```", text, re.S)
    return code_spans(text) + [line for block in blocks for line in block.splitlines()]


def parser_commands(parser_main, argv: list[str]) -> set[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser_main([*argv, "--help"])
    return set(re.search(r"\{([\w,-]+)\}", out.getvalue())[1].split(","))


def client_options(*command: str) -> set[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        solos_client.parse_args([*command, "--help"])
    return set(re.findall(r"^\s+(?:-\w+, )?(--[\w-]+)", out.getvalue(), re.M))


CLIENT_COMMANDS = parser_commands(solos_client.parse_args, [])
MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
ALL_OPTIONS = (
    set().union(*(options(command) for command in commands()))
    | set().union(*(client_options(command) for command in ("", *CLIENT_COMMANDS) if command))
    | client_options()
    | {"--help", "--version"}
)


def command_lines(text: str) -> list[tuple[str, list[str]]]:
    """(program, arguments) for each run of one of our programs in a span or a line of docs; a usage line's
    `[optional]` brackets dropped and its `a|b` alternatives read as their first."""
    runs = []
    text = re.split(r"(?:^|\s)#", text)[0]  # a shell comment is prose
    for program, pattern in (("client", CLIENT_PROGRAM), ("service", SERVICE_PROGRAM), ("make", r"\bmake\b")):
        for match in re.finditer(pattern, text):
            rest = re.split(r" #|\s\|\s|>|;|&&|\\$", text[match.end() :])[0].replace("[", "").replace("]", "")
            words = [word.split("|")[0] for word in rest.split()]
            if program == "service" and words[:1] == ["client"]:
                continue  # the client's run, read above
            if words and re.match(r"-|[a-z]", words[0]):  # not a path, a placeholder (COMMAND) or the line's end
                runs.append((program, words))
    return runs


def command_problem(program: str, words: list[str]) -> str | None:
    """Why our parser refuses the command a doc gives (an unknown command), or None."""
    if program == "make":
        return None if words[0].startswith(("-", "ARGS=")) or words[0] in MAKE_TARGETS else "no such make target"
    err = io.StringIO()
    parse = solos_client.parse_args if program == "client" else solos_memory.parse_args
    with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        parse(words)
    return "no such command" if "invalid choice" in err.getvalue() else None


def test_every_command_in_the_docs_exists():
    runs = [(doc, program, words) for doc in DOCS for text in code_texts(doc) for program, words in command_lines(text)]
    wrong = [(doc, words, problem) for doc, program, words in runs if (problem := command_problem(program, words))]
    assert wrong == []
    named = {words[0] for _, program, words in runs if program == "service"}
    assert {"serve", "snapshot", "restore", "check", "agents", "token"} <= named  # the scan finds the commands
    assert command_problem("service", ["snapshots"]) and command_problem("client", ["--best-effort", "recal"])


def routes_named(text: str) -> list[tuple[str | None, str]]:
    """(method or None, path) pairs a span or a line of docs names."""
    named: list[tuple[str | None, str]] = [(method, path) for method, path in METHOD_PATH.findall(text)]
    named += [(None, path) for path in ADDRESS_PATH.findall(text)]
    if re.fullmatch(r"/[\w./-]*", text) and text.startswith(SERVICE_PATHS):
        named.append((None, text))
    return named


def test_every_route_in_the_docs_is_served():
    wrong = []
    for doc in DOCS:
        for text in code_texts(doc):
            for method, path in routes_named(text):
                path = path.rstrip(".,")
                operation_path = any(op.path == path for op in solos_memory.OPERATIONS.values())
                if path not in solos_memory.KNOWN_PATHS and path != "/":
                    wrong.append((doc, path, "no such route"))
                elif method and operation_path and (method, path) not in solos_memory.ROUTES:
                    wrong.append((doc, f"{method} {path}", "no operation answers that method"))
    assert wrong == []


def flags_named(text: str) -> list[str]:
    if re.fullmatch(r"--[\w-]+(?: \S+)?", text):
        return [text.split()[0]]
    if re.search(rf"{SERVICE_PROGRAM}|{CLIENT_PROGRAM}|make serve", text):
        return re.findall(r"(?<![\w-])--[a-z][\w-]*", text.split("#", 1)[0].replace("pip install", "#"))
    return []


def test_every_flag_in_the_docs_is_an_option():
    unknown = [(doc, flag) for doc in DOCS for text in code_texts(doc) for flag in flags_named(text)]
    assert [(doc, flag) for doc, flag in unknown if flag not in ALL_OPTIONS] == []
    assert {flag for _, flag in unknown} >= {"--db", "--keep", "--a2a-record", "--best-effort", "--create"}


def install_commands(lines: list[str]) -> list[str]:
    return [line.split(" #", 1)[0].strip() for line in lines if line.strip()]


def test_the_units_install_steps_are_the_operations_pages():
    """lab-memory.service's header repeats docs/operations.md's install, agents and snapshot timer included."""
    header = (ROOT / "systemd" / "lab-memory.service").read_text().split("\n\n", 1)[0]
    steps = install_commands([line.removeprefix("#   ") for line in header.splitlines() if line.startswith("#   ")])
    section = OPERATIONS_PAGE.split("## Install and roll out on a systemd host", 1)[1]
    page = install_commands(re.search(r"```sh\n(.*?)```", section, re.S)[1].splitlines())
    assert [step for step in steps if step not in page] == []
    assert any(" agents add " in step for step in steps)
    assert any("lab-memory-snapshot.timer" in step and "enable" in step for step in steps)


# An issue's number means nothing to a reader of the repository: code, tests, benches and docs say what is meant.
# CHANGELOG.md and research/ are records of their time and keep theirs.
CITATION = re.compile(r"\bissues?[ -]#?\d", re.IGNORECASE)
CITING_SUFFIXES = {".py", ".md", ".sql", ".sh", ".service", ".timer", ".in"}
RECORDS = {"CHANGELOG.md", "research"}


def citing_files() -> list[Path]:
    """The repository's code, schema, script, unit and doc files, less the records and dot folders (venvs, caches)."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        here = Path(folder)
        skipped = {"__pycache__", "node_modules", "dist"}
        subfolders[:] = [
            name
            for name in sorted(subfolders)
            if not name.startswith(".")
            and name not in skipped
            and (here / name).relative_to(ROOT).as_posix() not in RECORDS
        ]
        found += [here / name for name in sorted(files) if Path(name).suffix in CITING_SUFFIXES]
    return [path for path in found if path.relative_to(ROOT).as_posix() not in RECORDS]


def test_nothing_cites_an_issue_by_number():
    files = citing_files()
    assert ROOT / "solos_memory.py" in files and ROOT / "schema.sql" in files and ROOT / "bench" / "README.md" in files
    cited = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if CITATION.search(line)
    ]
    assert not cited, "say what is meant instead of the issue's number:\n" + "\n".join(cited)
