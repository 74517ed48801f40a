from __future__ import annotations

from pathlib import Path

import pytest

from tests.audit.fake_engines import LoopbackServer, make_app

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "audit" / "configs"


@pytest.fixture(scope="session")
def engines():
    """Every fake engine, served over real HTTP on 127.0.0.1."""
    with LoopbackServer(make_app()) as server:
        yield server


@pytest.fixture
def config_path():
    return lambda name: str(CONFIGS / f"{name}.json")
