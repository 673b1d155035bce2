#!/usr/bin/env bash
# Installs dependencies, configures and builds Tessera into ${TESSERA_BUILD_DIR:-build} (binaries in bin/).
# Arguments name the targets to build (default: all of them, tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
build_dir="${TESSERA_BUILD_DIR:-build}"
jobs="${TESSERA_BUILD_JOBS:-2}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TESSERA_CMAKE_ARGS:-} >/dev/null
targets=()
if [ $# -gt 0 ]; then targets=(--target "$@"); fi
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
