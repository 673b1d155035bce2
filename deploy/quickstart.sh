#!/usr/bin/env bash
# The Quick start: installs what is missing, builds, and runs a whole local cluster (1 scheduler, 2 servers,
# 2 workers, each its own process) training an MLP on Fashion-MNIST in sync mode. Arguments go to
# tessera-launch (try --help), e.g. --job=deploy/jobs/fashion_mnist_mlp_async.pbtxt --run_dir=runs/async.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the run needs: the launcher and the three daemons it starts (deploy/test.sh builds everything).
bash deploy/build.sh tessera-launch tessera-scheduler tessera-server tessera-worker
exec "${TESSERA_BUILD_DIR:-build}/bin/tessera-launch" "$@"
