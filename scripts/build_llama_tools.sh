#!/usr/bin/env bash
# llama.cpp's own binaries (its speculative decoding, its plain completion, its bench), built from the llama.cpp
# source that the installed llama-cpp-python release vendors, so the peer runs the kernels our backend runs.
# Usage: scripts/build_llama_tools.sh VERSION OUT_DIR   (make llama-tools)
set -euo pipefail
version=$1
out=$2
pip=${PIP:-.venv/bin/pip}
mkdir -p "$out/sdist"
if [ ! -f "$out/src/CMakeLists.txt" ]; then
  "$pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$out/sdist"
  rm -rf "$out/src.partial" && mkdir -p "$out/src.partial"
  tar -xzf "$out/sdist/llama_cpp_python-$version.tar.gz" -C "$out/src.partial" --strip-components=3 \
    "llama_cpp_python-$version/vendor/llama.cpp"
  rm -rf "$out/src" && mv "$out/src.partial" "$out/src"
fi
cmake -S "$out/src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF > "$out/cmake.log"
cmake --build "$out/build" -j "${JOBS:-2}" --target llama-speculative-simple llama-completion llama-bench
echo "llama.cpp tools in $out/build/bin"
