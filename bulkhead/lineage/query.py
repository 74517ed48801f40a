"""Questions asked of a lineage log, by replaying it. Pure: no torch.

What a page holds. A page handed to a request (an `alloc`) may from then on
hold that request's tenant's KV; it holds it until the pool overwrites the
page (a `scrub`), whatever the ledger does meanwhile: a page freed and
handed out again unscrubbed still holds every earlier tenant's KV it held
(the incident's pages). A `cache_hit` hands a request cached pages to read,
holding what they hold. So:

    who_read(A): every request handed a page (alloc or cache_hit) while the
    page held tenant A's KV, with the request's tenant, the page, its
    generation, and the request and generation that put A's KV there.

By default it names only requests of other tenants and only pages that
still held A's KV: a scrubbed page no longer does. `include_scrubbed`
adds the requests handed a page that had held A's KV but was scrubbed
since (scrubbed=True): what the scrub stood between. "Handed" is what the
log can know without a record per token written: such a request could
read A's KV, and one whose attention reads only positions it wrote (every
request of the real protocol) does not. Each log is one process's pool; a
page number means nothing across logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bulkhead.lineage.verify import Line, read_lines


@dataclass(frozen=True)
class Read:
    log: str
    seq: int
    ts: float
    request: str
    tenant: str
    page: int
    generation: int
    via: str  # "alloc" or "cache_hit"
    held_by_request: str  # the request whose allocation put the tenant's KV in the page
    held_at_generation: int
    scrubbed: bool  # the page was scrubbed since


def records(path: Path):
    for _seg, line in read_lines(path):
        if isinstance(line, Line) and line.record is not None:
            yield line.record


def who_read(paths: list[Path], tenant: str, since: float | None = None, include_own: bool = False,
             include_scrubbed: bool = False) -> list[Read]:
    out: list[Read] = []
    for path in paths:
        # page -> tenant -> [request, generation, scrubbed since]
        held: dict[int, dict[str, list]] = {}
        for rec in records(path):
            kind = rec.get("kind")
            if kind in ("alloc", "cache_hit"):
                reader, reader_tenant = rec["request"], rec["tenant"]
                for page, gen in zip(rec["pages"], rec["gens"]):
                    h = held.get(page, {}).get(tenant)
                    if (h is not None and (include_own or reader_tenant != tenant)
                            and (include_scrubbed or not h[2]) and (since is None or rec["ts"] >= since)
                            and not (kind == "alloc" and h[0] == reader)):
                        out.append(Read(Path(path).name, rec["seq"], rec["ts"], reader, reader_tenant, page, gen,
                                        kind, h[0], h[1], h[2]))
                    if kind == "alloc":
                        held.setdefault(page, {})[reader_tenant] = [reader, gen, False]
            elif kind == "scrub":
                for page in rec["pages"]:
                    for h in held.get(page, {}).values():
                        h[2] = True
    return sorted(out, key=lambda r: (r.ts, r.log, r.seq, r.page))


@dataclass
class PageStory:
    page: int
    request: str
    via: str  # how the request got the page: "alloc" or "cache_hit"
    events: list[dict]  # the page's records: the tenure before the request's, then the request's own

    @property
    def handed_at(self) -> int:
        return next(i for i, e in enumerate(self.events)
                    if e.get("kind") == self.via and e.get("request") == self.request)

    def previous_holder(self) -> dict | None:
        """The alloc that put the KV there before the request got the page."""
        first = self.events[0] if self.events else None
        return first if first is not None and first.get("kind") == "alloc" and self.handed_at > 0 else None

    def scrubbed_before(self) -> bool | None:
        """Scrubbed between the previous holder and the request (None: no
        previous holder in the log)."""
        if self.previous_holder() is None:
            return None
        return any(e.get("kind") == "scrub" for e in self.events[: self.handed_at])


@dataclass
class RequestStory:
    request: str
    tenant: str | None
    records: list[dict]  # those naming the request
    pages: dict[tuple[str, int], PageStory]  # (log, page) -> story

    @property
    def adapter(self) -> dict | None:
        """The LoRA adapter the request ran under (name and digest), from its `adapter` record; None: the base model."""
        return next(({"name": r["name"], "digest": r["digest"]} for r in self.records if r.get("kind") == "adapter"),
                    None)

    def to_dict(self) -> dict:
        out = []
        for (log, p), s in sorted(self.pages.items()):
            prev = s.previous_holder()
            out.append({"log": log, "page": p, "via": s.via,
                        "previous_holder": None if prev is None else {"request": prev["request"],
                                                                      "tenant": prev["tenant"]},
                        "scrubbed_before_handed": s.scrubbed_before(), "history": s.events})
        return {"request": self.request, "tenant": self.tenant, "adapter": self.adapter, "records": self.records,
                "pages": out}


def request_story(paths: list[Path], request: str) -> RequestStory:
    """The request's records and pages. An HTTP response id (cmpl-..., chatcmpl-...)
    names its choices too: the engine's ids are `<id>-<prompt>-<choice>`
    (a whole id: `cmpl` alone names nothing)."""
    story = RequestStory(request, None, [], {})
    for path in paths:
        log = Path(path).name
        tenure: dict[int, list[dict]] = {}  # page -> its records since its last alloc
        before: dict[int, list[dict]] = {}  # page -> the tenure before that
        tracking: dict[int, PageStory] = {}  # pages of this request, still being followed
        for rec in records(path):
            kind = rec.get("kind")
            rid = rec.get("request")
            mine = rid == request or (isinstance(rid, str) and rid.rsplit("-", 2)[0] == request)
            if mine:
                story.records.append({"log": log, **rec})
                story.tenant = story.tenant or rec.get("tenant")
            for page in _pages_of(rec):
                if kind == "alloc":
                    before[page], tenure[page] = tenure.get(page, []), []
                tenure.setdefault(page, []).append(rec)
                if mine and kind in ("alloc", "cache_hit") and page not in tracking:
                    request_of = rid
                    events = (before.get(page, []) if kind == "alloc" else []) + tenure[page]
                    tracking[page] = story.pages[(log, page)] = PageStory(page, request_of, kind, list(events))
                elif page in tracking:
                    tracking[page].events.append(rec)
                    if kind == "free" and mine:
                        del tracking[page]
            if mine and kind == "end":
                tracking = {p: s for p, s in tracking.items() if s.via == "alloc"}
    return story


@dataclass(frozen=True)
class Named:
    """A request its client named with an X-Request-Id (a `name` record)."""

    request: str  # the server's response-level id (cmpl-..., chatcmpl-...): names every choice
    tenant: str
    ts: float


def requests_named(paths: list[Path], client_id: str, tenant: str | None = None) -> list[Named]:
    """The requests whose client sent X-Request-Id: client_id (of tenant, if
    given), oldest first. The id is the client's: unique only within its
    tenant and only while in flight, so it may name several requests. A
    `name` record names one choice (`<id>-<prompt>-<choice>`)."""
    found: dict[str, Named] = {}
    for path in paths:
        for rec in records(path):
            if rec.get("kind") == "name" and rec.get("client_id") == client_id and tenant in (None, rec["tenant"]):
                request = rec["request"].rsplit("-", 2)[0]
                if request not in found or rec["ts"] < found[request].ts:
                    found[request] = Named(request, rec["tenant"], rec["ts"])
    return sorted(found.values(), key=lambda n: n.ts)


def _pages_of(rec: dict) -> list[int]:
    if "pages" in rec and rec.get("kind") not in ("transfer", "grant", "commit"):
        return rec["pages"]
    if "page" in rec:
        return [rec["page"]]
    return []
