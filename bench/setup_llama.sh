#!/usr/bin/env bash
# Build bench/.llama-cpp/bin/llama-server: llama.cpp's own OpenAI-compatible
# server, a peer for bench/peers.py (which skips it, saying so, when absent),
# and llama-quantize beside it, which writes the K-quant GGUF files (Q4_K_M)
# that gguf-py cannot.
#
# Not llama-cpp-python's server: that one serves one request at a time and,
# by default, cuts a running stream short when the next request arrives, so
# at 4 and 16 clients it reported streams of a few tokens as throughput.
# llama-server runs one slot per client with continuous batching.
#
# The source is the llama.cpp that llama-cpp-python's PyPI sdist vendors
# (pinned below), fetched with pip so that only the package registry is
# needed. The build takes several minutes of both cores of this project's
# machines (cmake, a C++ compiler); run it when nobody else needs the machine.
# No GPU backend, no web UI (its assets would be downloaded), no HTTPS.
set -euo pipefail
cd "$(dirname "$0")"
PREFIX=${PREFIX:-$PWD/.llama-cpp}
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "setup_llama.sh: $tool is missing (apt-get install cmake g++)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$work"
tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
# Native CPU build (AVX2/AVX-512 as the machine has them).
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
cmake --build "$work/build" --target llama-server llama-quantize -j "${JOBS:-$(nproc)}"
mkdir -p "$PREFIX/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$PREFIX/bin/"
"$PREFIX/bin/llama-server" --version
test -x "$PREFIX/bin/llama-quantize"
echo "llama-server, llama-quantize (llama.cpp from llama-cpp-python $VERSION): $PREFIX/bin/"
