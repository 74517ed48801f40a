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


def test_the_lineage_log_reaches_a_worker_as_a_file_of_its_own(tmp_path):
    from dataclasses import replace

    from bulkhead.disagg.launch import worker_lineage
    from bulkhead.lineage.chain import worker_log_path
    from bulkhead.lineage.writer import LineageLog

    key = tmp_path / "lineage.key"
    config = replace(CONFIG, lineage_log=str(tmp_path / "lineage.jsonl"), lineage_key_file=str(key),
                     lineage_max_bytes=2**20)
    assert WorkerConfig.from_json(config.to_json()) == config
    sink = worker_lineage(config)
    try:
        assert isinstance(sink, LineageLog) and sink.path == tmp_path / "lineage.decode-0.jsonl"
        assert key.exists()  # made, mode 0600, when missing
    finally:
        sink.close()
    assert worker_log_path(Path("/x/lin"), "prefill-1") == Path("/x/lin.prefill-1")
    assert not worker_lineage(CONFIG).enabled  # no flag: the no-op sink
    with pytest.raises(ValueError, match="--lineage-key"):
        replace(CONFIG, lineage_log="/x/lineage.jsonl")
