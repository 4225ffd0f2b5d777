"""The run is hermetic: conftest's session hooks fail it if a package is installed while the tests run."""

from __future__ import annotations

from pathlib import Path

from conftest import installed_packages


def test_a_package_installed_during_the_run_is_seen(tmp_path: Path):
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "aiohttp-3.9.0.dist-info").mkdir(parents=True)
    before = installed_packages((venv,))
    (site / "edge_tts-6.1.9.dist-info").mkdir()  # what Hermes's lazy installer once added mid-run
    assert installed_packages((venv,)) ^ before == {"lib/python3.11/site-packages/edge_tts-6.1.9.dist-info"}


def test_the_set_up_venvs_are_watched():
    assert installed_packages(), "no .venv/.venv-hermes packages found: the hermetic check would watch nothing"
