#!/usr/bin/env bash
# Installs dependencies, configures and builds Tessera into ${TESSERA_BUILD_DIR:-build} (binaries in bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
build_dir="${TESSERA_BUILD_DIR:-build}"
jobs="${TESSERA_BUILD_JOBS:-2}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TESSERA_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$jobs"
