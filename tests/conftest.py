"""Shared fixtures: the example plugin packages, installed for real with pip, and tiny models."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.plugins import reset_registry
from specdec.testing import TinyTarget, make_tiny_target

TESTS_DIR = Path(__file__).resolve().parent
PLUGIN_SOURCES = [TESTS_DIR / "example_plugin", TESTS_DIR / "broken_plugin"]
PLUGIN_MODULES = ("specdec_echo_example", "specdec_broken_example", "specdec_exit_example")


def _pip_install(sources: list[Path], target: Path) -> None:
    base = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check", "--quiet"]
    attempts = [[*base, "--no-build-isolation"], base]
    errors = []
    for cmd in attempts:
        proc = subprocess.run(
            [*cmd, "--target", str(target), *map(str, sources)], capture_output=True, text=True, timeout=300
        )
        if proc.returncode == 0:
            return
        errors.append(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    raise RuntimeError("pip could not install the example plugins:\n" + "\n".join(errors))


@pytest.fixture(scope="session")
def installed_plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install ``specdec-plugin-echo-example`` and ``specdec-plugin-broken-example`` with pip into
    a temporary directory and put it on ``sys.path``, so their entry points are discovered the way
    a user's installed plugins are. Everything is undone at teardown."""
    root = tmp_path_factory.mktemp("plugins")
    # Build from copies: an in-tree build would leave build/ and *.egg-info in tests/.
    sources = [Path(shutil.copytree(src, root / "src" / src.name)) for src in PLUGIN_SOURCES]
    site = root / "site"
    _pip_install(sources, site)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    reset_registry()
    try:
        yield site
    finally:
        while str(site) in sys.path:
            sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.split(".")[0] in PLUGIN_MODULES]:
            del sys.modules[name]
        importlib.invalidate_caches()
        reset_registry()


@pytest.fixture(scope="session")
def plugins_env(installed_plugins: Path) -> dict[str, str]:
    """Environment for a subprocess that must find the example plugins: their folder first on
    ``PYTHONPATH``, before what this process was given (where specdec itself may be installed)."""
    inherited = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(installed_plugins), *([inherited] if inherited else [])])}


@pytest.fixture
def fresh_registry():
    """Reset the process-wide plugin registry before and after the test (request it after
    ``monkeypatch`` so the env var is set when the registry reloads)."""
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def watch_prefills(monkeypatch):
    """``watch_prefills(runner)`` returns the list of the prompts ``runner`` prefills from then on
    (its ``last_only`` forwards), in order."""

    def watch(runner) -> list[list[int]]:
        prompts: list[list[int]] = []
        forward = runner.forward

        def counted(cache, ids, **kw):
            if kw.get("last_only"):
                prompts.append(list(ids))
            return forward(cache, ids, **kw)

        monkeypatch.setattr(runner, "forward", counted)
        return prompts

    return watch


@pytest.fixture(scope="session")
def tiny(device: torch.device) -> TinyTarget:
    """The tiny random fp32 Llama (seed 0) with the character-level tokenizer, on the device
    under test (``SPECDEC_TEST_DEVICE``)."""
    return make_tiny_target(seed=0, device=device)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target and its tokenizer saved as a model directory (for CLI subprocesses)."""
    path = tmp_path_factory.mktemp("tiny")
    target = make_tiny_target()
    target.model.save_pretrained(path)
    target.tokenizer.save_pretrained(path)
    return path
