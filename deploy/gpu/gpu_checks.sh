#!/usr/bin/env bash
# The GPU checks of the CUDA backend, in two halves, because the GPU machine has no Debian packages:
#
#   deploy/gpu/gpu_checks.sh prepare   # on a Debian build machine: build for sm_90 into build-gpu/ and pack the
#                                      # binaries, the shared libraries they need (not CUDA's) and the
#                                      # Fashion-MNIST files into .device/ (about 50 MiB)
#   deploy/gpu/gpu_checks.sh run       # on the GPU machine, from the repository root with .device/ beside it;
#                                      # TESSERA_GPU_OUT (default runs/gpu-checks) gets the logs
#
# `run` prints one table: the parity suite, GEMM TFLOP/s beside cuBLAS's best, local-mode training samples/s
# beside PyTorch (same model, batch and optimizer, same GPU, same run), and a job with one GPU worker and one
# CPU worker against 2 servers trained to 0.85 test accuracy. cuBLAS and the CUDA runtime come from the GPU
# machine (its CUDA toolkit, or PyTorch's nvidia-* packages).
set -euo pipefail
cd "$(dirname "$0")/../.."

prepare() {
  TESSERA_BUILD_DIR=build-gpu \
    TESSERA_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release" bash deploy/build.sh
  rm -rf .device
  mkdir -p .device/stage/bin .device/stage/lib .device/data
  for b in tessera-launch tessera-scheduler tessera-server tessera-worker cuda_backend_test gemm_bench; do
    cp build-gpu/bin/$b .device/stage/bin/
    strip .device/stage/bin/$b
  done
  ldd .device/stage/bin/* | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libcudart)\.so' |
    xargs -I{} cp -L {} .device/stage/lib/
  tar -C .device/stage -cJf .device/bundle.tar.xz .
  rm -rf .device/stage
  cp /usr/share/datasets/fashion-mnist/*.gz .device/data/
  du -sh .device
}

# Adds the carried data files to a job file.
with_data() {
  cat "$1"
  printf 'data { format: IDX train_images: "%s" train_labels: "%s" test_images: "%s" test_labels: "%s" }\n' \
    "$data/train-images-idx3-ubyte.gz" "$data/train-labels-idx1-ubyte.gz" \
    "$data/t10k-images-idx3-ubyte.gz" "$data/t10k-labels-idx1-ubyte.gz"
}

json_field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
median_samples() {
  python3 -c "import json,sys,statistics; r=[json.loads(l)['samples_per_sec'] for l in open(sys.argv[1])]; print(round(statistics.median(r)))" "$1"
}

run() {
  [[ -f .device/bundle.tar.xz ]] || { echo "no .device/bundle.tar.xz: run '$0 prepare' first" >&2; exit 2; }
  local t
  t=$(mktemp -d)
  trap 'rm -rf "$t"' EXIT
  tar -C "$t" -xJf .device/bundle.tar.xz
  data="$(pwd)/.device/data"
  local cuda_libs
  cuda_libs=$(python3 - <<'PY'
import glob, os
dirs = ["/usr/local/cuda/lib64"]
try:
    import nvidia
    for p in nvidia.__path__:
        dirs += glob.glob(os.path.join(p, "*", "lib"))
except ImportError:
    pass
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
  export LD_LIBRARY_PATH="$t/lib:$cuda_libs"
  local out=${TESSERA_GPU_OUT:-runs/gpu-checks}  # logs, run directories and the table
  mkdir -p "$out"
  nvidia-smi -L || true

  echo "== parity suite"
  "$t/bin/cuda_backend_test" --gtest_brief=1 2>&1 | tee "$out/parity.txt" | grep -E "PASSED|FAILED|SKIPPED|tests ran" || true
  local parity
  parity=$(grep -E "^\[  PASSED  \]" "$out/parity.txt" | head -1)
  grep -q "FAILED" "$out/parity.txt" && parity="FAILED: $(grep -c '^\[  FAILED  \]' "$out/parity.txt") tests"

  echo "== GEMM TFLOP/s"
  "$t/bin/gemm_bench" | tee "$out/gemm.txt"

  echo "== local-mode training, Tessera vs PyTorch"
  local rows=""
  for batch in 128 1024; do
    with_data deploy/jobs/fashion_mnist_mlp_gpu_local.pbtxt | sed "s/^batch_size: .*/batch_size: $batch/" > "$out/local_$batch.pbtxt"
    "$t/bin/tessera-worker" --local --device=cuda:0 --job="$out/local_$batch.pbtxt" --run_dir="$out/local_$batch" \
      > "$out/local_$batch.log" 2>&1
    local ours theirs
    ours=$(median_samples "$out/local_$batch/metrics.jsonl")
    theirs=$(python3 deploy/gpu/torch_reference.py --data "$data" --batch $batch --steps 3000 | tee "$out/torch_$batch.json" |
      python3 -c "import json,sys; print(round(json.load(sys.stdin)['samples_per_sec']))")
    rows+="| local training, batch $batch (samples/s) | $ours | PyTorch: $theirs |"$'\n'
  done

  echo "== mixed job: one GPU worker, one CPU worker, 2 servers"
  with_data deploy/jobs/fashion_mnist_mlp_hetero.pbtxt > "$out/hetero.pbtxt"
  "$t/bin/tessera-launch" --job="$out/hetero.pbtxt" --worker_devices=cuda:0,cpu --run_dir="$out/hetero" | tail -4
  local accuracy seconds
  accuracy=$(json_field "$out/hetero/summary.json" test_accuracy)
  seconds=$(json_field "$out/hetero/summary.json" seconds_to_target)

  echo
  {
    echo "| check | Tessera | reference |"
    echo "|---|---|---|"
    echo "| parity suite (cuda_backend_test) | $parity | CPU backend |"
    printf '%s' "$rows"
    echo "| 1 GPU + 1 CPU worker, 2 servers, sync | test accuracy $accuracy after $seconds s | target 0.85 |"
    echo
    cat "$out/gemm.txt"
  } | tee "$out/table.md"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
