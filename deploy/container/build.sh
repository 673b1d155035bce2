#!/usr/bin/env bash
# Builds the Tessera container image (deploy/container/Dockerfile) from the binaries of a build folder, then
# smoke-checks it. Needs root (or a user of the docker group when an engine already runs) and a built tree
# (deploy/build.sh).
#
#   deploy/container/build.sh           # image tessera:latest; smoke check: every binary's --help in the image
#   deploy/container/build.sh --train   # also trains the default job in a container (--network none, ~1 minute)
#   deploy/container/build.sh --pytorch # image tessera-pytorch:latest: also the Python package, its examples and
#                                       # Debian's python3-torch, to run a PyTorch script as the workers
#                                       # (deploy/k8s/overlays/pytorch)
#
# Environment:
#   TESSERA_BUILD_DIR      build folder whose bin/ holds the binaries (default build)
#   TESSERA_IMAGE          tag of the image (default tessera:latest)
#   TESSERA_BASE_IMAGE     Debian 12 base image (default tessera-base:bookworm, made here when missing with
#                          `debootstrap --variant=minbase` and `docker import`, since no registry may answer;
#                          debian:bookworm where one does)
#   TESSERA_DEBIAN_MIRROR  Debian mirror for debootstrap and for apt inside the image (default: the mirror of
#                          this machine's "bookworm" entry in /etc/apt/sources.list and sources.list.d; its
#                          bookworm-updates and bookworm-security entries are copied into the base too)
#   TESSERA_CONTAINER_DIR  work folder: build context and the state of an engine started here
#                          (default $TESSERA_BUILD_DIR/container)
#   TESSERA_STRIP          1 (default): the image's binaries are stripped of debug info; 0 keeps it
#   DOCKER_HOST            the engine to use. When no engine answers, Debian's dockerd (package docker.io,
#                          installed when missing, as is debootstrap) is started here without networking
#                          (--bridge=none --iptables=false; builds use --network host, runs --network none),
#                          with its own data root, socket and pid file, and stopped when this script ends.
set -euo pipefail
cd "$(dirname "$0")/../.."

train=0
pytorch=0
for arg in "$@"; do
  case "$arg" in
    --train) train=1 ;;
    --pytorch) pytorch=1 ;;
    *) echo "usage: $0 [--train] [--pytorch]" >&2; exit 2 ;;
  esac
done

build_dir="${TESSERA_BUILD_DIR:-build}"
image="${TESSERA_IMAGE:-tessera:latest}"
((pytorch == 0)) || image="${TESSERA_IMAGE:-tessera-pytorch:latest}"
base="${TESSERA_BASE_IMAGE:-tessera-base:bookworm}"
work="${TESSERA_CONTAINER_DIR:-$build_dir/container}"
strip="${TESSERA_STRIP:-1}"
binaries=(tessera-scheduler tessera-server tessera-worker tessera-launch)
export DOCKER_BUILDKIT=0  # the classic builder: works with Debian's engine and any client, no buildx needed

for b in "${binaries[@]}"; do
  [[ -x "$build_dir/bin/$b" ]] || { echo "build.sh: $build_dir/bin/$b is missing; build first (deploy/build.sh)" >&2; exit 2; }
done
mkdir -p "$work"
work="$(cd "$work" && pwd)"
start=$SECONDS
phase() { echo "== [$((SECONDS - start)) s] $*"; }

# ---- Debian mirrors from this machine's apt sources: prints "URI SUITE" for every enabled deb entry.
apt_entries() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ } print $i, $(i + 1) }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
      { types = ""; uris = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^#/ || $i !~ /^[A-Za-z-]+:/) continue
          key = tolower(substr($i, 1, index($i, ":") - 1)); value = substr($i, index($i, ":") + 1)
          if (key == "types") types = value; else if (key == "uris") uris = value
          else if (key == "suites") suites = value; else if (key == "enabled") enabled = tolower(value)
        }
        if (types !~ /(^|[ \t])deb([ \t]|$)/ || enabled ~ /no/) next
        nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
        for (a = 1; a <= nu; a++) for (b = 1; b <= ns; b++) if (u[a] != "" && s[b] != "") print u[a], s[b]
      }' "$f"
  done
}
suite_uri() { apt_entries | awk -v s="$1" '$2 == s { print $1; exit }'; }

# ---- The engine: one that answers, or Debian's dockerd started here.
engine_pid=""
engine_run=""
stop_engine() {
  if [[ -n "$engine_pid" ]]; then
    kill -TERM "$engine_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$engine_pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$engine_pid" 2>/dev/null || true
    wait "$engine_pid" 2>/dev/null || true
    echo "build.sh: stopped the engine started here (log: $work/dockerd.log)"
  fi
  if [[ -n "$engine_run" ]]; then
    # dockerd leaves its default network namespace mounted under the exec root.
    awk -v d="$engine_run/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n1 umount -l
    rm -rf "$engine_run"
  fi
}
trap stop_engine EXIT

if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null && command -v debootstrap >/dev/null || bash deploy/install_deps.sh docker.io debootstrap
  phase "starting dockerd (data root $work/docker)"
  # Sockets have a short path limit, so the socket, pid file and exec root go to a fresh temporary folder.
  engine_run="$(mktemp -d "${TMPDIR:-/tmp}/tessera-docker.XXXXXX")"
  export DOCKER_HOST="unix://$engine_run/docker.sock"
  dockerd --bridge=none --iptables=false --data-root "$work/docker" --exec-root "$engine_run/exec" \
    --pidfile "$engine_run/docker.pid" --host "$DOCKER_HOST" >"$work/dockerd.log" 2>&1 &
  engine_pid=$!
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$engine_pid" 2>/dev/null || { tail -n 30 "$work/dockerd.log" >&2; echo "build.sh: dockerd exited" >&2; exit 1; }
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { tail -n 30 "$work/dockerd.log" >&2; echo "build.sh: dockerd does not answer" >&2; exit 1; }
fi
docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}'

# ---- The base image.
if [[ "$base" == "tessera-base:bookworm" ]] && ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || bash deploy/install_deps.sh debootstrap
  mirror="${TESSERA_DEBIAN_MIRROR:-$(suite_uri bookworm)}"
  [[ -n "$mirror" ]] || { echo "build.sh: no 'bookworm' entry in /etc/apt; set TESSERA_DEBIAN_MIRROR" >&2; exit 2; }
  rootfs="$work/rootfs"
  rm -rf "$rootfs"
  phase "debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; echo "build.sh: debootstrap failed" >&2; exit 1; }
  {
    echo "deb $mirror bookworm main"
    if [[ -z "${TESSERA_DEBIAN_MIRROR:-}" ]]; then
      updates="$(suite_uri bookworm-updates)"; security="$(suite_uri bookworm-security)"
      [[ -z "$updates" ]] || echo "deb $updates bookworm-updates main"
      [[ -z "$security" ]] || echo "deb $security bookworm-security main"
    else
      echo "deb $mirror bookworm-updates main"
    fi
  } >"$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  phase "docker import -> $base"
  tar -C "$rootfs" --numeric-owner -c . | docker import - "$base" >/dev/null
  rm -rf "$rootfs"
fi

# ---- The build context: the Dockerfile, the binaries, and the libraries from outside the system folders.
phase "build context in $work/context"
ctx="$work/context"
rm -rf "$ctx"
mkdir -p "$ctx/bin" "$ctx/lib" "$ctx/python"
cp deploy/container/Dockerfile "$ctx/"
if ((pytorch)); then
  [[ -d "$build_dir/python/tessera" ]] || { echo "build.sh: $build_dir/python/tessera is missing: build with pybind11-dev" >&2; exit 2; }
  cp -r "$build_dir/python/tessera" "$ctx/python/"
  cp -r worker/python/examples "$ctx/python/examples"
fi
for b in "${binaries[@]}"; do
  cp "$build_dir/bin/$b" "$ctx/bin/"
  [[ "$strip" != 1 ]] || strip --strip-debug "$ctx/bin/$b"
  ldd "$build_dir/bin/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
    case "$lib" in
      /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) ;;  # Debian's: installed in the image by apt
      *) [[ -e "$ctx/lib/${lib##*/}" ]] || cp -L "$lib" "$ctx/lib/" ;;
    esac
  done
done
ls "$ctx/lib" | sed 's/^/  extra library: /'

phase "docker build -t $image (base $base)"
docker build --network host --build-arg BASE="$base" --build-arg PYTORCH="$pytorch" -t "$image" "$ctx" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; echo "build.sh: docker build failed (log: $work/build.log)" >&2; exit 1; }
echo "$image: $(docker image inspect "$image" --format '{{.Size}}' | awk '{ printf "%.0f MB", $1 / 1e6 }'), base $base:" \
  "$(docker image inspect "$base" --format '{{.Size}}' | awk '{ printf "%.0f MB", $1 / 1e6 }'), extra libraries:" \
  "$(du -sm "$ctx/lib" | cut -f1) MB, binaries: $(du -sm "$ctx/bin" | cut -f1) MB"

phase "smoke check: --help of each binary in a container (--network none)"
docker run --rm --network none "$image" sh -ec \
  'for b in tessera-scheduler tessera-server tessera-worker tessera-launch; do "$b" --help >/dev/null; done; id'

if ((train)); then
  phase "training the default job in a container (--network none)"
  docker run --rm --network none "$image" tessera-launch --run_dir=/tmp/run --timeout_s=600 --linger_s=0 --device=cpu
fi
phase "done: $image"
