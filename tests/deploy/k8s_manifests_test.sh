#!/usr/bin/env bash
# Checks the Kubernetes manifests (deploy/k8s) offline, with no cluster:
#  1. `kubectl kustomize` renders the base and every overlay;
#  2. every rendered object passes its kind's API schema (deploy/k8s/validate/validate.js, kubernetes-models);
#  3. the manifests agree with the daemons (deploy/k8s/validate/check_consistency.js): each TESSERA_* variable
#     names a flag in the binary's --help, ports, probes, Services, cluster sizes, worker ranks, mounted files
#     and the shared checkpoint volume line up;
#  4. the real tessera-scheduler loads each overlay's job (the ConfigMap) with the scheduler's cluster size.
# The checkers are first shown a broken manifest, which they must refuse.
#
#   tests/deploy/k8s_manifests_test.sh      # binaries from ${TESSERA_BUILD_DIR:-build}/bin
#
# Needs kubectl, node and npm (exit 77, skipped, without them); installs the checkers' npm packages into
# deploy/k8s/validate/node_modules (npm ci, from package-lock.json) when missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${TESSERA_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
K8S="$ROOT/deploy/k8s"
VALIDATE="$K8S/validate"

fail() {
  echo "k8s_manifests_test: FAIL: $*" >&2
  exit 1
}

for tool in kubectl node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "k8s_manifests_test: SKIP: $tool is not installed"
    exit 77
  fi
done
for role in scheduler server worker; do
  [[ -x "$BUILD/bin/tessera-$role" ]] || fail "$BUILD/bin/tessera-$role is missing (build first, or set TESSERA_BUILD_DIR)"
done

if [[ ! -f "$VALIDATE/node_modules/.package-lock.json" ||
      "$VALIDATE/package-lock.json" -nt "$VALIDATE/node_modules/.package-lock.json" ]]; then
  echo "installing the checkers' packages (npm ci) into deploy/k8s/validate/node_modules"
  (cd "$VALIDATE" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci in deploy/k8s/validate failed"
fi

TMP="$(mktemp -d)"
SCHEDULER_PID=""
cleanup() {
  if [[ -n "$SCHEDULER_PID" ]]; then kill -KILL "$SCHEDULER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# The daemons read TESSERA_* variables as flags: none from this shell may leak into them.
CLEAN_ENV=(env)
while read -r name; do CLEAN_ENV+=(-u "$name"); done < <(compgen -e | grep '^TESSERA_' || true)

# Each binary's flags, as its --help lists them.
for role in scheduler server worker; do
  "${CLEAN_ENV[@]}" "$BUILD/bin/tessera-$role" --help >"$TMP/$role.help" 2>&1 || true
  grep -q '^ *-tls_cert ' "$TMP/$role.help" || fail "tessera-$role --help lists no flags: $(head -3 "$TMP/$role.help")"
done
HELP=(--help-scheduler="$TMP/scheduler.help" --help-server="$TMP/server.help" --help-worker="$TMP/worker.help")

# The checkers must refuse what is wrong: an object against its schema, an unknown kind, and a container port
# that is not the port the daemon listens on.
kubectl kustomize "$K8S/base" >"$TMP/base.yaml" || fail "kubectl kustomize deploy/k8s/base failed"
cat >"$TMP/bad-schema.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: bad}
spec: {ports: [{port: "grpc"}]}
---
apiVersion: example.com/v1
kind: NoSuchKind
metadata: {name: bad}
EOF
if node "$VALIDATE/validate.js" --name=self-check "$TMP/bad-schema.yaml" >"$TMP/out" 2>&1; then
  cat "$TMP/out"
  fail "validate.js accepted a Service with a string port and an unknown kind"
fi
grep -q 'unknown kind' "$TMP/out" || fail "validate.js did not name the unknown kind: $(cat "$TMP/out")"
sed '0,/containerPort: 7070/s//containerPort: 7071/' "$TMP/base.yaml" >"$TMP/bad-port.yaml"
if node "$VALIDATE/check_consistency.js" --name=self-check "${HELP[@]}" "$TMP/bad-port.yaml" >"$TMP/out" 2>&1; then
  cat "$TMP/out"
  fail "check_consistency.js accepted a container port 7071 for TESSERA_PORT=7070"
fi
grep -q 'container port grpc is 7071 but TESSERA_PORT=7070' "$TMP/out" ||
  fail "check_consistency.js did not name the broken port: $(cat "$TMP/out")"
echo "self-check: the checkers refuse a broken schema, an unknown kind and a wrong container port"

# The real scheduler must load the job of the ConfigMap with the cluster size of its TESSERA_* variables.
check_job() {
  local name="$1" rendered="$2" dir="$TMP/job-$3"
  mkdir -p "$dir"
  node -e '
    const fs = require("fs");
    const yaml = require(process.argv[1] + "/node_modules/js-yaml");
    const objects = yaml.loadAll(fs.readFileSync(process.argv[2], "utf8")).filter(Boolean);
    const map = objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === "tessera-job");
    if (!map || !map.data || !map.data["job.pbtxt"]) throw new Error("no ConfigMap tessera-job with job.pbtxt");
    fs.writeFileSync(process.argv[3] + "/job.pbtxt", map.data["job.pbtxt"]);
    const scheduler = objects.find((o) => o.kind === "Deployment" && o.metadata.name === "tessera-scheduler");
    const env = Object.fromEntries(scheduler.spec.template.spec.containers[0].env.map((e) => [e.name, e.value]));
    fs.writeFileSync(process.argv[3] + "/size", `${env.TESSERA_NUM_SERVERS} ${env.TESSERA_NUM_WORKERS}\n`);
  ' "$VALIDATE" "$rendered" "$dir" || fail "$name: cannot extract the job and the cluster size"
  local servers workers
  read -r servers workers <"$dir/size"
  "${CLEAN_ENV[@]}" "$BUILD/bin/tessera-scheduler" --job="$dir/job.pbtxt" --port=0 --http_port=-1 \
    --num_servers="$servers" --num_workers="$workers" --checkpoint_dir="$dir/checkpoints" \
    --address_file="$dir/address" >"$dir/log" 2>&1 &
  SCHEDULER_PID=$!
  local deadline=$((SECONDS + 20))
  while [[ ! -s "$dir/address" ]]; do
    if ! kill -0 "$SCHEDULER_PID" 2>/dev/null; then
      wait "$SCHEDULER_PID" || true
      SCHEDULER_PID=""
      fail "$name: tessera-scheduler refused the job of ConfigMap tessera-job: $(tail -5 "$dir/log")"
    fi
    ((SECONDS < deadline)) || fail "$name: tessera-scheduler did not listen within 20 s: $(tail -5 "$dir/log")"
    sleep 0.1
  done
  # Its log line naming the cluster may come just after the address file: wait for it (a while) before the kill.
  while ! grep -q ", $servers servers, $workers workers" "$dir/log" && ((SECONDS < deadline)); do
    sleep 0.1
  done
  kill -KILL "$SCHEDULER_PID"
  wait "$SCHEDULER_PID" 2>/dev/null || true
  SCHEDULER_PID=""
  grep -q ", $servers servers, $workers workers" "$dir/log" ||
    fail "$name: the scheduler did not take $servers servers and $workers workers: $(head -3 "$dir/log")"
  echo "$name: tessera-scheduler loads the job for $servers servers and $workers workers"
}

overlays=("$K8S/base")
for dir in "$K8S"/overlays/*/; do
  [[ -f "$dir/kustomization.yaml" ]] && overlays+=("${dir%/}")
done
((${#overlays[@]} >= 3)) || fail "expected the base and at least two overlays, found ${overlays[*]}"

status=0
index=0
for dir in "${overlays[@]}"; do
  index=$((index + 1))
  name="overlay $(basename "$dir")"
  rendered="$TMP/rendered-$index.yaml"
  if ! kubectl kustomize "$dir" >"$rendered" 2>"$TMP/kustomize.err"; then
    echo "$name: kubectl kustomize failed: $(cat "$TMP/kustomize.err")"
    status=1
    continue
  fi
  # validate.js prints "overlay X: N objects valid" last; the per-object lines only when something is wrong.
  if node "$VALIDATE/validate.js" --name="$name" "$rendered" >"$TMP/out" 2>&1; then
    tail -1 "$TMP/out"
  else
    grep -v '^  valid ' "$TMP/out"
    status=1
  fi
  if node "$VALIDATE/check_consistency.js" --name="$name" "${HELP[@]}" "$rendered" >"$TMP/out" 2>&1; then
    tail -1 "$TMP/out"
  else
    cat "$TMP/out"
    status=1
  fi
  check_job "$name" "$rendered" "$index"
done

((status == 0)) || fail "the manifests disagree with their schemas or with the daemons (see above)"
echo "k8s_manifests_test: PASS (${#overlays[@]} renderings)"
