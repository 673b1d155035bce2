#!/usr/bin/env bash
# Checks beyond deploy/test.sh (CI runs them after it; see .ci/run):
#   deploy/checks.sh sanitizers    # one clang build: AddressSanitizer + UndefinedBehaviorSanitizer, thread-safety
#                                  # analysis as errors, libFuzzer targets; then every test of deploy/test.sh,
#                                  # the fuzzers' corpora, and each fuzzer mutating for FUZZ_SECONDS (default 60)
#   deploy/checks.sh fuzz          # the fuzzers only, for FUZZ_SECONDS each (after a sanitizers build)
#   deploy/checks.sh thread-safety # the thread-safety analysis alone (no tests; minutes)
#   deploy/checks.sh container     # builds the container image (deploy/container/build.sh: Debian's docker engine,
#                                  # a Debian base made with debootstrap) and trains the default job inside it
# A finding of any of them fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == container ]]; then
  exec bash deploy/container/build.sh --train
fi
# clang and its runtimes for the build.
bash deploy/install_deps.sh clang libclang-rt-14-dev
for tool in clang++ clang; do
  command -v "$tool" >/dev/null || { echo "needs clang and libclang-rt-14-dev (apt-get install clang)" >&2; exit 2; }
done
dir="${TESSERA_BUILD_DIR:-build-asan}"
fuzz_seconds="${FUZZ_SECONDS:-60}"
# UndefinedBehaviorSanitizer findings stop the process (so they fail the test); ASan reports leaks at exit.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"

# A build folder configured with another compiler is configured afresh (CMake would drop the flags below).
fresh_if_not_clang() {
  if [[ -f "$1/CMakeCache.txt" ]] && ! grep -q "^CMAKE_CXX_COMPILER:.*clang++" "$1/CMakeCache.txt"; then
    rm -rf "$1/CMakeCache.txt" "$1/CMakeFiles"
  fi
}

fuzz() {
  mkdir -p "$dir/fuzz"
  for fuzzer in job_spec_fuzzer shard_store_fuzzer scheduler_fuzzer checkpoint_fuzzer; do
    echo "== $fuzzer: ${fuzz_seconds} s"
    # New inputs go to a scratch corpus; a crash is written to $dir/fuzz/crash-* (copy it to
    # tests/fuzz/regressions/$fuzzer/ once fixed, and it runs as a test from then on).
    mkdir -p "$dir/fuzz/$fuzzer"
    log="$dir/fuzz/$fuzzer.log"
    if ! "$dir/bin/$fuzzer" -max_total_time="$fuzz_seconds" -print_final_stats=1 -timeout=30 \
        -rss_limit_mb=4096 -artifact_prefix="$dir/fuzz/" "$dir/fuzz/$fuzzer" "tests/fuzz/corpus/$fuzzer" >"$log" 2>&1; then
      tail -n 60 "$log" >&2
      echo "$fuzzer found a failure; the input is in $dir/fuzz/" >&2
      exit 1
    fi
    grep -a -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)" "$log" || true
  done
}

case "${1:-}" in
  sanitizers)
    # promtool, for the /metrics lint test among those run here.
    bash deploy/install_deps.sh prometheus
    flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
    flags+=" -fsanitize=fuzzer-no-link -Wthread-safety -Werror=thread-safety"
    fresh_if_not_clang "$dir"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DTESSERA_ENABLE_CUDA=OFF \
      -DTESSERA_FUZZ=ON -DTESSERA_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$flags" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
    cmake --build "$dir" -j 2
    # The deploy label checks scripts and manifests (deploy/test.sh runs it); here the C++ is under test.
    ctest --test-dir "$dir" -j 2 --output-on-failure --timeout 900 -LE "deploy|bench"
    fuzz
    ;;
  fuzz)
    fuzz
    ;;
  thread-safety)
    dir="${TESSERA_BUILD_DIR:-build-tsa}"
    fresh_if_not_clang "$dir"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DTESSERA_ENABLE_CUDA=OFF \
      -DBUILD_TESTING=OFF -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" >/dev/null
    cmake --build "$dir" -j 2
    ;;
  *)
    echo "usage: $0 sanitizers|fuzz|thread-safety|container" >&2
    exit 2
    ;;
esac
