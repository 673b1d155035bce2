#!/usr/bin/env bash
# Extra checks for maintainers (minutes each; not part of deploy/test.sh):
#   deploy/checks.sh sanitizers    # AddressSanitizer + UndefinedBehaviorSanitizer build, then every test
#   deploy/checks.sh thread-safety # clang build with -Wthread-safety -Werror (the ABSL_GUARDED_BY annotations)
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
case "${1:-}" in
  sanitizers)
    dir="${TESSERA_BUILD_DIR:-build-asan}"
    cmake -S . -B "$dir" -G Ninja -DTESSERA_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
    cmake --build "$dir" -j 2
    ctest --test-dir "$dir" -j 2 --output-on-failure --timeout 600
    ;;
  thread-safety)
    command -v clang++ >/dev/null || { echo "needs clang (apt-get install clang)" >&2; exit 2; }
    dir="${TESSERA_BUILD_DIR:-build-tsa}"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DTESSERA_ENABLE_CUDA=OFF \
      -DBUILD_TESTING=OFF -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" >/dev/null
    cmake --build "$dir" -j 2
    ;;
  *)
    echo "usage: $0 sanitizers|thread-safety" >&2
    exit 2
    ;;
esac
