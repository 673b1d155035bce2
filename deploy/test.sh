#!/usr/bin/env bash
# Builds and runs the test suite: unit, in-process cluster and multi-process tests (labels unit, cluster,
# multiprocess). GPU tests skip, with the reason, on machines without a GPU. Benchmarks are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
ctest --test-dir "${TESSERA_BUILD_DIR:-build}" -j 2 --output-on-failure --timeout 600 "$@"
