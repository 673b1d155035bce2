#!/usr/bin/env bash
# Builds and runs the test suite: unit, in-process cluster, multi-process and deployment tests (labels unit,
# cluster, multiprocess, deploy). GPU tests skip, with the reason, on machines without a GPU. Benchmarks (label
# bench) are not run here: `ctest --test-dir build -L bench` runs them. Besides what the build needs, the tests
# use a real Slurm (slurm-wlm, munge), installed here when missing. The /metrics lint test runs where
# Prometheus' promtool is installed (deploy/checks.sh installs Debian's prometheus package, which on a host with
# systemd also starts a Prometheus server: not something a test command should do on its own).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh slurm-wlm munge
bash deploy/build.sh
ctest --test-dir "${TESSERA_BUILD_DIR:-build}" -j 2 --output-on-failure --timeout 600 -LE bench "$@"
