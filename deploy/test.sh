#!/usr/bin/env bash
# Builds and runs the test suite: unit, in-process cluster, multi-process and deployment tests (labels unit,
# cluster, multiprocess, deploy). GPU tests skip, with the reason, on machines without a GPU. Benchmarks are not
# tests. Besides what the build needs, the tests use a real Slurm (slurm-wlm, munge) and Prometheus' linter
# (promtool, in the prometheus package), installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh slurm-wlm munge prometheus
bash deploy/build.sh
ctest --test-dir "${TESSERA_BUILD_DIR:-build}" -j 2 --output-on-failure --timeout 600 "$@"
