#!/usr/bin/env bash
# The data-plane benchmark: installs iperf3 if missing, builds, runs build/bin/tessera-bench and the PyTorch rows
# (deploy/bench/pytorch_bench.py, section h) and prints one Markdown table in which every speed is a ratio to a
# reference measured in the same run. The table also goes to ${TESSERA_BENCH_TABLE:-runs/bench/table.md};
# progress goes to stderr. Arguments go to tessera-bench (try
# --help), e.g. --sections=a,b,c --repeats=3. Build directory: ${TESSERA_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v iperf3 >/dev/null; then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "data_plane.sh: installing iperf3" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends iperf3 >/dev/null
fi
bash deploy/build.sh >&2
table="${TESSERA_BENCH_TABLE:-runs/bench/table.md}"
mkdir -p "$(dirname "$table")"
"${TESSERA_BUILD_DIR:-build}/bin/tessera-bench" "$@" | tee "$table"
# Section h, the PyTorch rows (deploy/bench/pytorch_bench.py), with the Python package and Debian's python3-torch;
# TESSERA_BENCH_PYTORCH=0 leaves them out.
build_dir="${TESSERA_BUILD_DIR:-build}"
if [[ ${TESSERA_BENCH_PYTORCH:-1} != 0 ]]; then
  if [[ -d $build_dir/python/tessera ]] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
    PYTHONPATH="$build_dir/python" /usr/bin/python3 deploy/bench/pytorch_bench.py --bin="$build_dir/bin" \
      --work="$(dirname "$table")/pytorch" | tee -a "$table"
  else
    echo "data_plane.sh: no Python package or no python3-torch: section h (PyTorch) left out" >&2
  fi
fi
echo "data_plane.sh: table written to $table" >&2
