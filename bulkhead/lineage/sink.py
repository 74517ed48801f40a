"""What the KV components tell the lineage log. Pure Python: no torch, no I/O.

The ledger, the pool's scrub, the prefix cache, the engine and the transfer
workers each hold one `LineageSink` and call it as pages change hands. The
base class is the sink of a server run without `--lineage-log`: every
method does nothing, so a disabled log costs one method call per event and
changes no behaviour. A sink never raises into its caller and never
decides anything: it only records (bulkhead.lineage.writer.LineageLog).

Calls come from the engine thread (ledger, scrub, cache, request end) and
from a worker's link and transfer threads (grant, transfer, commit); an
implementation must accept them from any thread and keep their order.
"""

from __future__ import annotations


class LineageSink:
    """Events about tenant KV. Page lists and generation lists run in step."""

    enabled = False

    def allocated(self, request: str, tenant: str, pages: list[int], generations: list[int]) -> None:
        """The ledger handed `pages` (FREE -> OWNED) to request of tenant."""

    def freed(self, owner: str, pages: list[int], generations: list[int], tenants: list[str | None]) -> None:
        """OWNED -> DIRTY: owner gave pages up; each still holds tenants[i]'s KV."""

    def donated(self, request: str, page: int, generation: int, new_owner: str) -> None:
        """A page moved from request to new_owner (the prefix cache), KV unchanged."""

    def scrubbed(self, pages: list[int], mode: str) -> None:
        """The pool overwrote pages' bytes ("zero" or "poison"): their KV is gone."""

    def reusable(self, pages: list[int]) -> None:
        """DIRTY -> FREE in the ledger (the ledger does not know whether the
        bytes were scrubbed: only `scrubbed` says that)."""

    def cache_hit(self, request: str, tenant: str, pages: list[int], generations: list[int],
                  page_tenants: list[str | None]) -> None:
        """request of tenant was given cached pages to read (holding page_tenants' KV)."""

    def named(self, request: str, tenant: str, client_id: str) -> None:
        """The client named request with its X-Request-Id (an id unique only
        within the tenant, and only while in flight): `bulkhead lineage
        request` finds the request by it."""

    def adapter(self, request: str, tenant: str, name: str, digest: str) -> None:
        """request runs under tenant's LoRA adapter `name` whose weights hash
        to `digest`: every page handed to it from now on (alloc, cache_hit)
        is recorded with the adapter. Never its path: that is the operator's."""

    def request_end(self, request: str, tenant: str | None, reason: str) -> None:
        """The engine ended request (finished, aborted, failed, or handed over to a transfer)."""

    def granted(self, request: str, tenant: str, room: int, epoch: int, pages: list[int],
                generations: list[int]) -> None:
        """Decode granted pages to a remote writer for request."""

    def transferred(self, request: str, tenant: str, src_pages: list[int], dst_pages: list[int],
                    generations: list[int], manifest_digest: str) -> None:
        """Prefill wrote src_pages' KV into decode's dst_pages and sent the manifest."""

    def committed(self, request: str, tenant: str, pages: list[int], generations: list[int],
                  manifest_digest: str) -> None:
        """Decode verified the manifest and marked the transferred KV ready."""

    def refused(self, request: str, tenant: str | None, reason: str, manifest_digest: str | None) -> None:
        """Decode refused a transfer's KV (the request fails closed)."""

    def stats(self) -> dict | None:
        """What /ready, /server_info and the metrics report; None when off."""
        return None

    def close(self) -> None:
        """Flush and stop (a no-op when off)."""


NULL_SINK = LineageSink()
