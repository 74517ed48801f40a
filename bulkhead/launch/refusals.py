"""What stops `bulkhead serve` before it binds a port or starts a worker.

Each check answers the reason to refuse (logged, exit status 2), or None.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

from bulkhead.engine.engine_config import GUARDS_OFF_WARNING
from bulkhead.server.auth import KeyStore

log = logging.getLogger("bulkhead")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_keys(args, model_id: str | None = None) -> tuple[KeyStore | None, str | None]:
    """The key store (None: single tenant on loopback), or the whole line
    that says why not to start."""
    try:
        keys = KeyStore.from_sources(args.api_keys, model_id)
    except (OSError, ValueError) as e:  # a mistake in keys.toml names its line: refuse to start
        return None, f"refusing to start: {e}"
    if keys is None and not is_loopback(args.host):
        return None, f"refusing to bind {args.host} without API keys: pass --api-keys or bind 127.0.0.1"
    if keys is not None and args.unsafe_no_guards:
        return None, "refusing --unsafe-no-guards with API keys: without its guards one tenant's KV can reach another's"
    if args.unsafe_no_guards:
        log.warning(GUARDS_OFF_WARNING)
    return keys, None


def check_lineage_flags(args) -> str | None:
    """The lineage key, made once here before any worker starts (so two
    workers never race to create it); it must be a key of its own."""
    if args.lineage_log is None:
        return None
    if args.lineage_key is None:
        return "--lineage-log needs --lineage-key FILE (hex; created, mode 0600, if missing)"
    from bulkhead.lineage.chain import LineageKeyError, load_key

    try:
        load_key(args.lineage_key, create=True)
    except (OSError, LineageKeyError) as e:
        return str(e)
    cluster_key = args.cluster_key_file
    if cluster_key is not None and Path(cluster_key).exists() and \
            Path(cluster_key).resolve() == Path(args.lineage_key).resolve():
        return "--lineage-key must be a key of its own, not the cluster key"
    if args.role == "router":
        log.warning("--lineage-log on a router alone records nothing: it holds no KV pages (pass it to the workers)")
    return None


def log_keys(keys: KeyStore | None) -> None:
    if keys is None:
        log.warning("no API keys: serving one tenant 'default' on loopback only")
        return
    log.info("API keys loaded for %d tenants (%d in the tenant table), %d operator keys", len(keys.tenants),
             len(keys.policies), len(keys.operators))
    if not keys.operators:
        log.warning("no operator keys: /metrics and /server_info refuse every request; add an [operators] "
                    "table to the keys file or set BULKHEAD_OPERATOR_KEYS")
