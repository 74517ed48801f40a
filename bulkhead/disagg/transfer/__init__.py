"""KV transfer data plane: backends (shm, tcp, mooncake) behind one interface (see base)."""

from bulkhead.disagg.transfer.base import (  # noqa: F401 - the package's interface
    BACKENDS, TransferError, TransferSource, TransferTarget, make_source, make_target,
)
from bulkhead.kv.digest import page_digest, page_digests  # noqa: F401
