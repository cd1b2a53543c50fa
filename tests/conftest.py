"""Test-suite set-up: our Hypothesis ``ci`` profile, loaded explicitly.

Hypothesis would auto-load its own built-in ``ci`` profile when ``$CI`` is
set; registering ours under that name and loading it here makes every run
(local, CI, ``-n 1`` or ``-n auto``) use derandomized, database-free settings.
"""

import os
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


def pytest_report_header(config):
    return f"blockfuzz: BLOCKFUZZ_DEVICE={os.environ.get('BLOCKFUZZ_DEVICE', 'auto')}"
