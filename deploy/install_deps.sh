#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera builds, tests and trains with, and any packages named as arguments
# (deploy/checks.sh adds clang's); skips what is already installed.
# Runs apt-get as root (through sudo when not root). CUDA is not installed here: when nvcc is present
# (e.g. /usr/local/cuda) the CUDA backend is built, otherwise the build is CPU-only.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev libssl-dev zlib1g-dev
  libopenblas-dev nlohmann-json3-dev libcpp-httplib-dev libgtest-dev libgmock-dev
  dataset-fashion-mnist openssl libucx-dev
  pybind11-dev python3-dev python3-pybind11 python3-numpy python3-pytest python3-torch python3-torchvision
  python3-matplotlib
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
