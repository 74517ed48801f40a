"""A spawned worker's whole configuration travels as JSON and comes back
equal; a configuration that names an unknown setting or role is refused."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from bulkhead.disagg.worker_config import WorkerConfig
from bulkhead.engine.builder import EngineConfig

ENGINE = EngineConfig(Path("/models/smol"), "smol", 2**30, context_length=512, clamp_context_length=True,
                      scrub_mode="poison", threads=1, prefix_cache=True, guards=True)
CONFIG = WorkerConfig("decode", "decode-0", "tcp://127.0.0.1:9001", Path("/keys/cluster.key"), ENGINE, "tcp", 3.0,
                      "debug")


def test_a_config_round_trips_through_json():
    assert WorkerConfig.from_json(CONFIG.to_json()) == CONFIG


def test_every_engine_setting_travels():
    # A new EngineConfig field reaches spawned workers without a flag list to update.
    sent = json.loads(CONFIG.to_json())["engine"]
    assert set(sent) == {f.name for f in fields(EngineConfig)}


def test_unknown_engine_settings_are_refused():
    body = json.loads(CONFIG.to_json())
    body["engine"]["turbo"] = True
    with pytest.raises(ValueError, match="turbo"):
        WorkerConfig.from_json(json.dumps(body))


@pytest.mark.parametrize("change,why", [({"role": "router"}, "role"), ({"router": ""}, "--router"),
                                        ({"drain_lease_s": 0}, "--drain-lease")])
def test_bad_configs_are_refused(change, why):
    body = {**json.loads(CONFIG.to_json()), **change}
    with pytest.raises(ValueError, match=why):
        WorkerConfig.from_json(json.dumps(body))
