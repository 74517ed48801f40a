"""Named searches: which world, which protocol, which violation to look for.
Shared by the CLI, the tests and docs/verification.md."""
from __future__ import annotations

from dataclasses import replace

from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import Result, explore
from bulkhead.verify.world import World, default_world, small_world

import re


def cross_tenant(kind: str, detail: str, labels: list) -> bool:
    return kind == "cross_tenant_read"


def incident_path(kind: str, detail: str, labels: list) -> bool:
    """A cross-tenant read, by the request prefill rejected (the stub), of a
    page its manifest never listed: nobody wrote it for this request."""
    if not cross_tenant(kind, detail, labels) or not any("PrefillFailed" in l for l in labels):
        return False
    reader, page = re.match(r"r(\d+) .* read page (\d+)", detail).groups()
    manifests = [l for l in labels if f"TransferDone(r{reader} " in l]
    return bool(manifests) and not re.search(rf"[\[ ,]{page}[\],]", manifests[0].split("pages")[1])


def abort_during_transfer(kind: str, detail: str, labels: list) -> bool:
    """A cross-tenant read of KV that an aborted request's write put on the
    page after decode had already freed it."""
    if not cross_tenant(kind, detail, labels):
        return False
    victim = re.search(r"holding r(\d+)'s KV", detail).group(1)
    freed = [i for i, l in enumerate(labels) if f"Finalize(r{victim} ABORTED) to decode" in l]
    return bool(freed) and any(f"Landing(r{victim} " in l for l in labels[freed[0]:])


LEGACY_GOALS = {
    "shortest": cross_tenant,
    "incident": incident_path,
    "abort_during_transfer": abort_during_transfer,
}


def legacy_world(goal_name: str) -> World:
    """The environment the incident had: no attacker, no crash, no lost
    write. Reordering and deadlines always; a client abort where asked."""
    if goal_name == "abort_during_transfer":  # two requests suffice, and it is 10x faster
        return replace(small_world(), name="small, benign", faults=1, fault_kinds=frozenset({"abort"}))
    return replace(default_world(), name="default, benign", faults=0, fault_kinds=frozenset({"abort"}))


def legacy_search(goal_name: str, world: World | None = None) -> Result:
    world = world or legacy_world(goal_name)
    config = world.protocol(Guards.none(), Variant.LEGACY)
    return explore(world, config, goal=LEGACY_GOALS[goal_name], stop_at_goal=True, liveness=False)

