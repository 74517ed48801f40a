#!/usr/bin/env bash
# Build bench/.venv-llama: llama-cpp-python's OpenAI server, a peer for
# bench/peers.py (which skips it, saying so, when this venv is absent).
#
# PyPI has only its source: pip compiles llama.cpp, which takes about 11
# minutes of both cores of this project's machines (cmake, a C++ compiler;
# ninja if present). Run it when nobody else needs the machine.
# It serves the model's GGUF (the bundled SmolLM2 Q4_1); torch is not needed.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv-llama}
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "setup_llama.sh: $tool is missing (apt-get install cmake g++)" >&2; exit 1; }
done
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Native CPU build (AVX2/AVX-512 as the machine has them); no GPU backend.
CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=ON"} CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} \
    "$VENV/bin/python" -m pip install -q "llama-cpp-python[server]==$VERSION"
"$VENV/bin/python" -c "import llama_cpp, llama_cpp.server; print('llama-cpp-python', llama_cpp.__version__, 'ok')"
