"""The README stays true: every operation documented, the quick start runs as written on a fresh service."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

import pyz_build
import solos_memory

README = (ROOT / "README.md").read_text()


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


def set_up_commands() -> list[str]:
    """The Set up section's commands, in order."""
    section = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def zero_install_command() -> list[str]:
    """The bare-python3 alternative the Set up section names in its prose."""
    section = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`(python3 solos_memory\.py serve[^`]*)`", section)[0].split()


def test_set_up_has_exactly_two_commands_the_service_and_the_tests():
    assert set_up_commands() == ["make serve", "make test"]
    assert zero_install_command() == ["python3", "solos_memory.py", "serve", "--register", "atlas,sol"]


def test_quick_start_works_right_after_the_zero_install_set_up_command(tmp_path):
    """Run the README's own commands: the serve line (on a free port) in a fresh folder, then every curl."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    for name in pyz_build.REQUIRED_FILES:  # what the service needs beside it
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
        audit = next(a for a in answers if "reads" in a)
        assert [(r["reader"], r["author"]) for r in audit["reads"]] == [("sol", "atlas")]
        assert (tmp_path / "solos.db").exists()
    finally:
        process.terminate()
        process.wait(timeout=10)
