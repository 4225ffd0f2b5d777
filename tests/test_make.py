"""The edit loop's make targets: the set-up runs once, not on every `make test`, and `make quick` is the fast set."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, skip_or_fail

INSTALLS = "pip install -q -r requirements-test.txt"


def dry_run(folder: Path, target: str) -> str:
    """What `make -n target` would run in folder (nothing is run)."""
    if shutil.which("make") is None:
        skip_or_fail("make is not installed")
    done = subprocess.run(["make", "-n", target], cwd=folder, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def set_up_copy(tmp_path: Path) -> Path:
    """The Makefile and the set-up's inputs in a folder whose set-up has run (its stamp newer than them)."""
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copy(ROOT / "requirements-test.txt", tmp_path)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    stamp = tmp_path / ".venv" / "setup-done"
    stamp.parent.mkdir()
    stamp.touch()
    later = time.time() + 10
    os.utime(stamp, (later, later))
    return tmp_path


def test_make_test_does_not_install_again_when_nothing_changed(set_up_copy):
    assert INSTALLS not in dry_run(set_up_copy, "test")


def test_make_test_installs_again_when_the_requirements_change(set_up_copy):
    later = time.time() + 20
    os.utime(set_up_copy / "requirements-test.txt", (later, later))
    assert INSTALLS in dry_run(set_up_copy, "test")


def test_make_quick_runs_the_tests_not_marked_slow(set_up_copy):
    commands = dry_run(set_up_copy, "quick")
    assert INSTALLS not in commands
    assert '-m "not slow"' in commands
