"""The GGUF import says it is still working while its long, silent steps run (issue 16 item 6)."""

import logging
import threading

import pytest

from bulkhead.model import gguf_import


class _Stop(Exception):
    pass


def test_a_line_is_logged_while_the_import_runs(tmp_path, monkeypatch):
    import transformers

    beat = threading.Event()

    class Watcher(logging.Handler):
        def emit(self, record):
            if "still importing" in record.getMessage():
                beat.set()

    def slow_load(*_args, **_kw):
        # Stands in for transformers dequantizing the GGUF: it returns once a
        # heartbeat line was logged (bounded, so a missing heartbeat fails, not hangs).
        assert beat.wait(30), "nothing was logged while the import ran"
        raise _Stop

    monkeypatch.setattr(gguf_import, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", slow_load)
    watcher = Watcher()
    gguf_import.log.addHandler(watcher)
    level = gguf_import.log.level
    # setLevel, not the attribute: it clears the logger's cached isEnabledFor answers
    # (an earlier test in the process may have logged at INFO while it was off).
    gguf_import.log.setLevel(logging.INFO)
    try:
        with pytest.raises(_Stop):
            gguf_import.convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
    finally:
        gguf_import.log.removeHandler(watcher)
        gguf_import.log.setLevel(level)
    assert not any(t.name == "gguf-import-heartbeat" for t in threading.enumerate())  # it stops with the import
