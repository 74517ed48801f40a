"""A tenant's adapter names resolve in that tenant only, and follow keys.toml's reloads."""

import os
import time

from bulkhead.lora.registry import AdapterRegistry
from bulkhead.server.auth import KeyStore
from bench.lora_adapters import TINY, write_adapter

KEYS = """
[keys]
"sk-a" = "alpha"
"sk-b" = "beta"

[tenants.alpha.adapters]
sql = "{a}"

[tenants.beta.adapters]
sql = "{b}"
"""


def _store(tmp_path, text):
    path = tmp_path / "keys.toml"
    path.write_text(text)
    return KeyStore(path, base_model_id="base")


def _touch_newer(path):
    t = time.time() + 5
    os.utime(path, (t, t))


def test_each_tenant_resolves_its_own_adapter_and_never_anothers(tmp_path):
    a, b = write_adapter(tmp_path / "a", seed=1), write_adapter(tmp_path / "b", seed=2)
    keys = _store(tmp_path, KEYS.format(a=a, b=b))
    registry = AdapterRegistry(TINY).follow(keys)
    alpha, beta = registry.resolve("alpha", "sql"), registry.resolve("beta", "sql")
    assert (alpha.tenant, beta.tenant) == ("alpha", "beta")
    assert alpha.files.digest != beta.files.digest
    assert registry.resolve("gamma", "sql") is None
    assert registry.names("alpha") == ["sql"] and registry.names("gamma") == []
    assert sorted((x.tenant, x.name) for x in registry.loaded()) == [("alpha", "sql"), ("beta", "sql")]


def test_a_reload_adds_and_removes_adapters_and_a_request_keeps_the_one_it_resolved(tmp_path):
    a, b = write_adapter(tmp_path / "a", seed=1), write_adapter(tmp_path / "b", seed=2)
    keys = _store(tmp_path, KEYS.format(a=a, b=b))
    registry = AdapterRegistry(TINY).follow(keys)
    held = registry.resolve("alpha", "sql")
    keys.path.write_text(KEYS.format(a=a, b=b).replace("[tenants.alpha.adapters]\nsql", "[tenants.alpha.adapters]\nsql2"))
    _touch_newer(keys.path)
    keys._checked = 0.0
    keys.maybe_reload()
    assert registry.resolve("alpha", "sql") is None
    assert registry.resolve("alpha", "sql2").files.digest == held.files.digest
    assert held.files.path == a  # the request in flight still holds its adapter


def test_a_bad_adapter_is_refused_and_the_others_keep_serving(tmp_path, caplog):
    a, b = write_adapter(tmp_path / "a", seed=1), write_adapter(tmp_path / "b", seed=2, config={"r": 999})
    registry = AdapterRegistry(TINY).follow(_store(tmp_path, KEYS.format(a=a, b=b)))
    assert registry.resolve("alpha", "sql") is not None
    assert registry.resolve("beta", "sql") is None
    (problem,) = registry.problems
    assert "tenant 'beta' adapter 'sql' refused" in problem and "adapter_config.json" in problem and "999" in problem
    assert problem in caplog.text


def test_changed_files_are_validated_again(tmp_path):
    a = write_adapter(tmp_path / "a", seed=1)
    registry = AdapterRegistry(TINY)
    first = registry.sync({"alpha": {"sql": a}})
    assert first == ()
    before = registry.resolve("alpha", "sql").files.digest
    write_adapter(a, seed=3)
    _touch_newer(a / "adapter_model.safetensors")
    registry.sync({"alpha": {"sql": a}})
    assert registry.resolve("alpha", "sql").files.digest != before


def test_the_resident_bytes_reported_are_what_a_worker_holds(tmp_path, tiny_model_dir):
    """On the default kernels a worker holds the copy the C delta reads, packed
    for this machine's products (int8 where the CPU has AVX-512 VNNI: about
    half of bf16's), and only that (bulkhead.model.lora_layers.pack_only);
    /server_info reports that figure and which products. The fp32 figure is
    reported too (the exact path's)."""
    from bulkhead.lora import products
    from bulkhead.lora.peft_files import BaseShapes, fp32_bytes, packed_bytes, read_adapter, read_weights
    from bulkhead.model.config import load_model_config
    from bulkhead.model.lora_layers import PackedAdapter
    from bulkhead.model.lora_weights import LoraWeights

    config = load_model_config(tiny_model_dir)
    shapes = BaseShapes.of(config)
    for rank, targets in ((8, ("q_proj", "v_proj", "down_proj")), (3, ("gate_proj", "up_proj", "o_proj", "k_proj"))):
        path = write_adapter(tmp_path / "-".join(targets), shapes, rank=rank, targets=targets)
        data = read_weights(path)
        files = read_adapter(path, shapes, data=data)
        weights = LoraWeights.load(files, config, data)
        assert fp32_bytes(files, shapes) == weights.nbytes
        for kind in ("bf16", "int8"):  # an odd rank's pad too
            assert packed_bytes(files, shapes, kind) == PackedAdapter(weights, kind).nbytes, kind
        assert packed_bytes(files, shapes, "fp32") >= PackedAdapter(weights, "fp32").nbytes
        assert packed_bytes(files, shapes, "int8") < 0.6 * packed_bytes(files, shapes, "bf16")
    registry = AdapterRegistry(shapes)
    registry.sync({"alpha": {"sql": files.path}})
    info = registry.info()
    sql = info["tenants"]["alpha"]["sql"]
    assert sql["products"] == products.preferred()
    assert sql["resident_bytes"] == info["resident_bytes"] == sql["packed_bytes"] < sql["fp32_bytes"]
    assert sql["packed_bytes"] == packed_bytes(files, shapes, products.preferred()) > 0
