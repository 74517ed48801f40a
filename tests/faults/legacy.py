"""The incident's admission path, for the fault matrix only.

SGLang's disaggregated engine did not retire a too-long request: it kept it
live as a 1-token stub while decode allocated pages for the full prompt and
attended over them, although nobody had written them for this request. This
module rebuilds exactly that, so that `bulkhead probe` can be shown to catch
it (tests/audit/test_probe_bulkhead.py). The harness (tests/faults/harness.py)
installs it at two seams, the admission function and the scheduler, when
the fault file names `legacy_admission`; the package itself has no such path
(tests/test_no_faults_in_package.py).
"""

from __future__ import annotations

from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import Request, RequestStatus
from bulkhead.engine.scheduler import Scheduler


class LegacyTicket(Admitted):
    """A rejected request kept alive instead of retired (the bug)."""


def add_stub(scheduler: Scheduler, ticket: Admitted) -> Request:
    """Pages for every prompt token, a watermark that claims they were
    written, and only the last token actually computed: decode then attends
    over whatever the freshly handed-out pages still hold."""
    n = len(ticket.prompt_token_ids)
    scheduler.ledger.allocate(ticket.request_id, ticket.tenant, -(-n // scheduler.config.page_size))
    # Positions [0, n-1) "computed" (never written); the last prompt token is
    # fed as if it had been sampled, so the next decode step reads them all.
    req = Request(ticket.request_id, ticket.tenant, list(ticket.prompt_token_ids[:-1]), ticket.params,
                  next(scheduler._arrivals), output_token_ids=[ticket.prompt_token_ids[-1]], num_computed=n - 1,
                  status=RequestStatus.RUNNING)
    req.charged = req.num_tokens  # as add_prefilled: the fair queue counts a live request once
    scheduler.requests[req.request_id] = req
    scheduler.waiting.join(req.tenant)
    scheduler.running.append(req)
    return req
