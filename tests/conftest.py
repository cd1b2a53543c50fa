"""Test-suite set-up: our Hypothesis ``ci`` profile, loaded explicitly.

Hypothesis would auto-load its own built-in ``ci`` profile when ``$CI`` is
set; registering ours under that name and loading it here makes every run
(local, CI, ``-n 1`` or ``-n auto``) use derandomized, database-free settings.
"""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

import harness.search.profiles  # noqa: F401  (registers the profiles)

settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ROOT / "corpora"


@pytest.fixture(scope="session")
def device():
    """The device gpu_impl runs on in this process (cpu without CUDA)."""
    from gpu_impl.device import current_device

    return current_device()


@pytest.fixture(autouse=True)
def _temporary_files_in_tmp_path(tmp_path_factory, monkeypatch):
    """Temporary files a test makes — the CLI's crash reports
    (``blockfuzz-crash-*.txt``) among them — land in a directory of pytest's
    own (beside, not in, the test's ``tmp_path``, which some tests expect
    empty), in this process and in the CLI processes it starts, not in /tmp."""
    d = str(tmp_path_factory.mktemp("tempfiles"))
    monkeypatch.setattr(tempfile, "tempdir", d)
    monkeypatch.setenv("TMPDIR", d)


def pytest_report_header(config):
    return f"blockfuzz: BLOCKFUZZ_DEVICE={os.environ.get('BLOCKFUZZ_DEVICE', 'auto')}"


def corpus_traces(token_slots: bool = False) -> list:
    """Every corpus trace of a block-table config (runner v1 / v2), or with
    ``token_slots`` those of a token-slot config (runner sglang: they run on
    --target sglang only); scenarios are not traces and are left out."""
    import json

    out = []
    for p in sorted(CORPORA.rglob("*.json")):
        obj = json.loads(p.read_text(encoding="utf-8"))
        if obj.get("format") != "blockfuzz-trace":
            continue  # a scenario (corpora/scenarios/): replayed through its engines' traces
        runner = obj.get("config", {}).get("runner")
        if (runner == "sglang") == token_slots:
            out.append(p)
    return out


INSTALL_HINT = {"vllm": "vLLM not installed (scripts/install-vllm-target.sh RELEASE)",
                "sglang": "SGLang not installed (scripts/install-sglang-target.sh RELEASE)"}


def give_up(engine: str):
    """How a test that needs ``engine`` gives up: ``pytest.skip``, or
    ``pytest.fail`` with ``$BLOCKFUZZ_REQUIRE_<ENGINE>=1`` (CI installs it: a
    broken install must not pass)."""
    required = os.environ.get(f"BLOCKFUZZ_REQUIRE_{engine.upper()}") == "1"
    return pytest.fail if required else pytest.skip


def installed_engine(engine: str):
    """The loaded engine (``harness.targets.<engine>_release.load()``): skips with
    one line without it (see :func:`give_up`)."""
    import importlib

    release = importlib.import_module(f"harness.targets.{engine}_release")
    if release.installed_version() is None:
        give_up(engine)(INSTALL_HINT[engine])
    try:
        return release.load()
    except release.TargetUnavailable as e:
        give_up(engine)(f"{engine} cannot be used in this process: {e}")
