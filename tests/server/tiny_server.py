"""A real `bulkhead serve` over a tiny random model: the bad-input, tenancy and
fuzz tests need the HTTP stack and the engine, not the model's answers."""

from __future__ import annotations

from pathlib import Path

from tests.server_process import ServerProcess
from tests.conftest import TEST_KEYS, make_tiny_model

# A key the tenancy tests revoke by rewriting the file while the server runs.
REVOCABLE_KEY, REVOCABLE_TENANT = "sk-gamma-revocable", "gamma"
ALPHA, BETA = "sk-alpha-test", "sk-beta-test"
# Long enough that a streamed request is still decoding when a test reads or
# cancels it (thousands of decode steps), while the model stays tiny.
LONG_CONTEXT = 8192


def write_keys(path: Path, keys: dict[str, str]) -> Path:
    path.write_text("[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in keys.items()))
    return path


def make_long_tiny_model(out: Path, tokenizer_from: Path) -> Path:
    return make_tiny_model(out, tokenizer_from, max_position_embeddings=LONG_CONTEXT)


def start_tiny_server(workdir: Path, model_dir: Path, *args: str) -> ServerProcess:
    keys = write_keys(workdir / "keys.toml", {**TEST_KEYS, REVOCABLE_KEY: REVOCABLE_TENANT})
    return ServerProcess(
        ["--role", "colocated", "--model", str(model_dir), "--api-keys", str(keys), "--scrub-mode", "poison",
         "--kv-memory", "64MiB", *args],
        workdir / "server.log",
    ).wait_ready()


def stop_checked(proc: ServerProcess) -> None:
    """Stop the server after checking that nothing failed closed and every page came back."""
    try:
        assert proc.metric("bulkhead_engine_failures_total") == 0, proc.log()
        proc.wait_idle()
    finally:
        proc.stop()
