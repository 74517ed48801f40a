"""Tenant-private adapters through the default deployment (router + prefill
+ decode processes, `--role local`) over a tiny model: each adapter's greedy
answer equals the colocated server's; a decode worker whose adapter files
hash to another digest than the signed ticket's refuses the request with
the typed 503 and the server keeps serving; both workers' lineage logs
record the adapter (name and digest, never the path) of every allocation.

The decode-side swap is the fault matrix's swap_adapter (tests/faults/
harness.py): decode's link rewrites the adapter's weights on disk when
transfer_done arrives, after prefill computed the prompt under the admitted
weights and before decode loads them."""

from __future__ import annotations

import json

import httpx
import pytest

from bulkhead.cli import main
from bulkhead.lora.peft_files import BaseShapes, read_adapter
from bulkhead.model.config import load_model_config
from tests.disagg.cluster_tools import arm, disarm, total, wait_for, wait_workers_idle
from tests.faults.adapter_swap import swap_weights
from bench.lora_adapters import write_adapter
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e
KEYS = {"sk-a": "alpha", "sk-b": "beta"}
PROMPT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
# (key, model): the base model (None), each tenant's own "sql", and another of alpha's.
CASES = (("sk-a", None), ("sk-a", "sql"), ("sk-b", "sql"), ("sk-a", "doc"))
# The adapter the fault swaps: never sent before it, so decode has never loaded its weights (a worker
# that holds an adapter's digest already runs the weights it was admitted with, whatever the disk says).
SWAPPED = ("sk-a", "swapped")
CHANGED = ("sk-a", "changed")  # its weights change on disk before any worker loads them: prefill refuses


def _keys_text(adapters: dict[str, dict[str, str]]) -> str:
    text = "[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in KEYS.items())
    for tenant, names in adapters.items():
        text += f"\n[tenants.{tenant}.adapters]\n" + "".join(f'"{n}" = "{p}"\n' for n, p in names.items())
    return text


def _post(proc, key, model=None):
    body = {**PROMPT, **({"model": model} if model else {})}
    return httpx.post(proc.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory, tiny_model_dir):
    """The colocated server's answers, then the default deployment (through the fault harness)."""
    work = tmp_path_factory.mktemp("lora-disagg")
    shapes = BaseShapes.of(load_model_config(tiny_model_dir))
    dirs = {name: write_adapter(work / name, shapes, rank=8, alpha=16, seed=seed, scale=0.5)
            for name, seed in (("alpha-sql", 1), ("beta-sql", 2), ("alpha-doc", 3), ("alpha-swapped", 4),
                                         ("alpha-changed", 5))}
    keys = work / "keys.toml"
    keys.write_text(_keys_text({"alpha": {"sql": dirs["alpha-sql"], "doc": dirs["alpha-doc"],
                                          "swapped": dirs["alpha-swapped"], "changed": dirs["alpha-changed"]},
                                "beta": {"sql": dirs["beta-sql"]}}))
    common = ["--model", str(tiny_model_dir), "--api-keys", str(keys), "--scrub-mode", "poison",
              "--kv-memory", "64MiB", "--prefix-cache", "on", "--threads", "1", "--lineage-key", str(work / "l.key")]
    colocated = ServerProcess(["--role", "colocated", *common, "--lineage-log", str(work / "colocated.jsonl")],
                              work / "colocated.log").wait_ready()
    try:
        reference = {case: _post(colocated, *case).json() for case in (*CASES, SWAPPED, CHANGED)}
        colocated_ids = {case: r["id"] for case, r in reference.items()}
    finally:
        colocated.stop()
    faults = work / "faults"
    cluster = ServerProcess(["--role", "local", *common, "--cluster-key-file", str(work / "cluster.key"),
                             "--lineage-log", str(work / "lineage.jsonl")],
                            work / "cluster.log", env={"BULKHEAD_FAULTS_FILE": str(faults)}).wait_ready(timeout=300)
    cluster.faults_file = faults
    digests = {name: read_adapter(d, shapes).digest for name, d in dirs.items()}
    try:
        yield cluster, reference, colocated_ids, dirs, digests, work
        assert cluster.metric("bulkhead_engine_failures_total") == 0, cluster.log()
        wait_workers_idle(cluster)
    finally:
        cluster.stop()


def test_each_adapter_answers_as_it_does_colocated(deployments):
    cluster, reference, _, _, _, _ = deployments
    for case in CASES:
        r = _post(cluster, *case)
        assert r.status_code == 200, (case, r.text)
        assert r.json()["model"] == reference[case]["model"]
        assert r.json()["choices"][0]["text"] == reference[case]["choices"][0]["text"], case
    texts = {reference[case]["choices"][0]["text"] for case in CASES}
    assert len(texts) == len(CASES)  # four sets of weights, four answers: the comparison can fail


def test_decode_refuses_weights_that_changed_after_admission_and_keeps_serving(deployments):
    cluster, reference, _, dirs, _, _ = deployments
    weights = dirs["alpha-swapped"] / "adapter_model.safetensors"
    original = weights.read_bytes()
    fired = total(cluster, "fault_swap_adapter", "decode", fresh=True)
    arm(cluster, "swap_adapter")
    try:
        r = _post(cluster, *SWAPPED)
    finally:
        disarm(cluster)
        weights.write_bytes(original)
    wait_for(lambda: total(cluster, "fault_swap_adapter", "decode") > fired, what="swap_adapter fired in decode")
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert (error["code"], error["type"]) == ("adapter_unavailable", "server_error"), r.text
    assert "swapped" in error["message"] and str(dirs["alpha-swapped"]) not in r.text
    assert "adapter 'swapped' refused" in cluster.log()  # decode's log says why
    wait_workers_idle(cluster)  # the granted pages went back, scrubbed
    for case in (*CASES, SWAPPED):  # still serving, the same answers; its own bytes back, the adapter serves again
        assert _post(cluster, *case).json()["choices"][0]["text"] == reference[case]["choices"][0]["text"], case


def test_prefill_refuses_weights_changed_on_disk_with_the_same_typed_error(deployments):
    """The router's registry hashed the files at load; they changed since. Prefill's
    refusal crosses to the client as AdapterUnavailable too (not a generic 500)."""
    cluster, reference, _, dirs, _, _ = deployments
    weights = dirs["alpha-changed"] / "adapter_model.safetensors"
    original = weights.read_bytes()
    swap_weights(str(dirs["alpha-changed"]))
    try:
        r = _post(cluster, *CHANGED)
    finally:
        weights.write_bytes(original)
    assert r.status_code == 503 and r.json()["error"]["code"] == "adapter_unavailable", r.text
    wait_workers_idle(cluster)
    assert _post(cluster, *CHANGED).json()["choices"][0]["text"] == reference[CHANGED]["choices"][0]["text"]


def _story(log, key, request_id, capsys) -> dict | None:
    """`bulkhead lineage request --json`; None while the request is not in the log yet (flushed every 0.2 s)."""
    capsys.readouterr()
    code = main(["lineage", "request", request_id, "--json", "--no-verify", "--key", str(key), str(log)])
    out = capsys.readouterr()
    assert code in (0, 2), out.err
    return json.loads(out.out) if code == 0 else None


def _allocated_in(story: dict | None) -> set[str]:
    return {rec["log"] for rec in story["records"] if rec["kind"] == "alloc"} if story else set()


def _check_story(story: dict, name: str | None, digest: str | None) -> None:
    assert story["adapter"] == ({"name": name, "digest": digest} if name else None)
    allocs = [r for r in story["records"] if r["kind"] == "alloc"]
    assert allocs, story  # the request was handed pages
    for rec in allocs:
        assert rec.get("adapter") == ({"name": name, "digest": digest} if name else None), rec


def test_lineage_records_the_adapter_of_every_allocation_and_never_its_path(deployments, capsys):
    cluster, _, colocated_ids, dirs, digests, work = deployments
    key = work / "l.key"
    for case, name, digest in ((("sk-a", "sql"), "sql", digests["alpha-sql"]),
                               (("sk-b", "sql"), "sql", digests["beta-sql"]), (("sk-a", None), None, None)):
        _check_story(_story(work / "colocated.jsonl", key, colocated_ids[case], capsys), name, digest)
        r = _post(cluster, *case)
        rid = r.json()["id"]
        # Both workers' logs: prefill's allocation and decode's grant of pages.
        wait_for(lambda: _allocated_in(_story(work / "lineage.jsonl", key, rid, capsys))
                 == {"lineage.prefill-0.jsonl", "lineage.decode-0.jsonl"}, what="both workers' allocations logged")
        _check_story(_story(work / "lineage.jsonl", key, rid, capsys), name, digest)
    capsys.readouterr()
    assert main(["lineage", "request", colocated_ids[("sk-a", "sql")], "--no-verify", "--key", str(key),
                 str(work / "colocated.jsonl")]) == 0
    assert f"adapter sql digest {digests['alpha-sql']}" in capsys.readouterr().out  # the text form says it too
    for log in work.glob("*.jsonl"):
        text = log.read_text()
        assert all(str(d) not in text for d in dirs.values()), log
