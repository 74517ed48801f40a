"""bulkhead.model.machine_cache: an entry's name changes with anything its
answer depends on, so a stale entry is never read; entries round-trip."""

import os
from pathlib import Path

import pytest
import torch

from bulkhead.model import machine_cache


def test_the_key_changes_with_the_machine_the_sources_and_the_parts(monkeypatch):
    base = machine_cache.key("weights", kernel="auto")
    assert machine_cache.key("weights", kernel="auto") == base
    assert machine_cache.key("weights", kernel="q4") != base
    assert machine_cache.key("decode-rows", kernel="auto") != base
    monkeypatch.setattr(machine_cache, "machine_identity", lambda: "flags: avx2\n2.13.0")
    other_cpu = machine_cache.key("weights", kernel="auto")
    assert other_cpu != base
    monkeypatch.setattr(machine_cache, "source_hash", lambda: "edited")
    assert machine_cache.key("weights", kernel="auto") != other_cpu


def test_the_model_is_identified_by_its_files_sizes_and_times(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = machine_cache.model_identity(tmp_path)
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))
    assert machine_cache.model_identity(tmp_path) != before


def test_entries_round_trip_and_an_unreadable_one_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_CACHE", str(tmp_path))
    machine_cache.write_json("m", {"multiple": 4})
    assert machine_cache.read_json("m") == {"multiple": 4}
    t = torch.arange(6, dtype=torch.float32)
    machine_cache.write_tensors("w", {"t": t}, {"kernel": "k"})
    tensors, meta = machine_cache.read_tensors("w")
    assert torch.equal(tensors["t"], t) and meta == {"kernel": "k"}
    (machine_cache.folder() / "w.safetensors").write_bytes(b"not a file of tensors")
    assert machine_cache.read_tensors("w") is None and machine_cache.read_json("absent") is None
    with machine_cache.computing("w"):  # the lock is free: taken at once
        pass


def vm_flags(address: int) -> list[str]:
    """The VmFlags (/proc/self/smaps) of this process's mapping that holds address."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):
            lo, hi = (int(x, 16) for x in first.split("-"))
            inside = lo <= address < hi
        elif inside and first == "VmFlags:":
            return line.split()[1:]
    return []


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="no /proc/self/smaps to read the advice from")
def test_tensors_read_from_an_entry_lie_on_memory_advised_for_huge_pages(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_CACHE", str(tmp_path))
    written = {"qs": torch.randint(0, 255, (3, 100), dtype=torch.uint8), "dm": torch.randn(7, 5),
               "empty": torch.empty(0, 4)}
    machine_cache.write_tensors("w", written, {})
    tensors, _ = machine_cache.read_tensors("w")
    assert all(torch.equal(tensors[k], v) for k, v in written.items())
    assert all(t.data_ptr() % 64 == 0 for t in tensors.values())  # a cache line each, as torch aligns its own
    assert "hg" in vm_flags(tensors["qs"].data_ptr())  # MADV_HUGEPAGE: a decode step streams these
