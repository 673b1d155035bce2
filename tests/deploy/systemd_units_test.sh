#!/usr/bin/env bash
# Checks the systemd units of deploy/systemd against the binaries of a build folder:
#  1. every TESSERA_ variable the units set (Environment=) or their example files set (the *.env.example named
#     by an EnvironmentFile=, commented-out lines included) names a flag of that unit's binary, as listed by
#     `tessera-<role> --help` (the daemons refuse an unknown TESSERA_ variable with exit 2);
#  2. the restart, stop and hardening settings every unit must keep;
#  3. `systemd-analyze verify` on copies of the units whose ExecStart= names the build's binaries (verify
#     checks that the executable exists), templates as instances (tessera-server@0.service): any message
#     about a Tessera unit fails;
#  4. the sysusers.d file, with systemd-sysusers into an empty root.
# Usage: tests/deploy/systemd_units_test.sh [BUILD_DIR]   (default ${TESSERA_BUILD_DIR:-build}, from the repo root)
# Exit status: 0 passed, 1 failed, 77 skipped (systemd-analyze missing; checks 1 and 2 still ran).
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
units_dir="$repo/deploy/systemd"
build="${1:-${TESSERA_BUILD_DIR:-build}}"
[[ "$build" == /* ]] || build="$repo/$build"
bin="$build/bin"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The flags of a binary, one a line. gflags' --help lists each as "    -name (description) type: ...".
# TESSERA_ variables of this environment are removed, since a daemon may refuse one that is not its flag.
flags_of() {
  local unset_args=() v
  for v in $(compgen -e | grep '^TESSERA_' || true); do unset_args+=(-u "$v"); done
  env "${unset_args[@]}" "$bin/$1" --help 2>&1 | sed -nE 's/^ +-([a-z0-9_]+) \(.*/\1/p' | sort -u
}

# Values of KEY= lines of a unit file (KEY at the start of a line), one a line.
unit_values() { sed -nE "s/^$2=(.*)$/\1/p" "$1"; }

# TESSERA_ names assigned in a file: lines TESSERA_X=... or #TESSERA_X=... (an example to uncomment).
assigned_in_env_file() { sed -nE 's/^[#[:space:]]*(TESSERA_[A-Z0-9_]+)=.*/\1/p' "$1" | sort -u; }

services=("$units_dir"/tessera-*.service)
[[ -e "${services[0]}" ]] || { fail "no units in deploy/systemd"; exit 1; }
declare -A example_used=()

for unit in "${services[@]}"; do
  name="$(basename "$unit")"
  role="${name#tessera-}"; role="${role%%@*}"; role="${role%.service}"
  if [[ ! -x "$bin/tessera-$role" ]]; then
    fail "$name: $bin/tessera-$role is missing (build first)"
    continue
  fi
  flags_of "tessera-$role" >"$tmp/flags-$role"
  [[ -s "$tmp/flags-$role" ]] || { fail "tessera-$role --help lists no flags"; continue; }
  unset_vars=" $(unit_values "$unit" UnsetEnvironment | tr '\n' ' ') "

  # 1. TESSERA_ variables: the unit's own Environment= lines, then the example of each EnvironmentFile=.
  check_var() {  # VAR WHERE
    local flag
    flag="$(tr 'A-Z' 'a-z' <<<"${1#TESSERA_}")"
    if grep -qx "$flag" "$tmp/flags-$role"; then
      pass "$name: $1 is --$flag of tessera-$role ($2)"
    else
      fail "$name: $1 ($2) names no flag of tessera-$role (no --$flag in its --help)"
    fi
  }
  for var in $(unit_values "$unit" Environment | grep -oE '(^|[[:space:]"])TESSERA_[A-Z0-9_]+=' | grep -oE 'TESSERA_[A-Z0-9_]+'); do
    check_var "$var" "Environment="
  done
  while read -r env_file; do
    optional=0
    [[ "$env_file" == -* ]] && { optional=1; env_file="${env_file#-}"; }
    example="$units_dir/$(basename "$env_file").example"
    if [[ ! -f "$example" ]]; then
      # Per-instance files (server-%i.env) have no example of their own; a required file must have one.
      ((optional)) || fail "$name: required $env_file has no example $(basename "$example")"
      continue
    fi
    example_used["$(basename "$example")"]=1
    for var in $(assigned_in_env_file "$example"); do
      [[ "$unset_vars" == *" $var "* ]] && { pass "$name: $var of $(basename "$example") is unset by the unit"; continue; }
      check_var "$var" "$(basename "$example")"
    done
  done < <(unit_values "$unit" EnvironmentFile)

  # 2. Settings every unit keeps: a finished job (exit 0) is not restarted; graceful stop on SIGTERM; hardening.
  for setting in Restart=on-failure RestartPreventExitStatus=2 KillSignal=SIGTERM NoNewPrivileges=yes \
      ProtectSystem=strict ProtectHome=yes PrivateTmp=yes User=tessera StateDirectory=tessera; do
    grep -qx "$setting" "$unit" || fail "$name: lacks $setting"
  done
  for key in RestartSec TimeoutStopSec StartLimitIntervalSec StartLimitBurst ExecStart After; do
    grep -q "^$key=" "$unit" || fail "$name: lacks $key="
  done
  grep -q '^After=.*network-online.target' "$unit" || fail "$name: not After=network-online.target"
  grep -qx "ExecStart=/usr/local/bin/tessera-$role" "$unit" || fail "$name: ExecStart is not /usr/local/bin/tessera-$role"
done
for example in "$units_dir"/*.env.example; do
  [[ -n "${example_used[$(basename "$example")]:-}" ]] || fail "$(basename "$example") is read by no unit"
done
grep -qx 'Environment=TESSERA_ID=%i' "$units_dir/tessera-server@.service" || fail "tessera-server@: TESSERA_ID is not the instance"
grep -qx 'Environment=TESSERA_RANK=%i' "$units_dir/tessera-worker@.service" || fail "tessera-worker@: TESSERA_RANK is not the instance"
((failures)) || pass "unit settings and TESSERA_ variables"

# 4. The sysusers.d file makes the user the units run as.
if command -v systemd-sysusers >/dev/null; then
  mkdir -p "$tmp/root/etc"
  if systemd-sysusers --root="$tmp/root" - <"$units_dir/tessera.sysusers" >"$tmp/sysusers.log" 2>&1 &&
      grep -q '^tessera:' "$tmp/root/etc/passwd"; then
    pass "tessera.sysusers creates the user tessera"
  else
    cat "$tmp/sysusers.log"
    fail "tessera.sysusers"
  fi
fi

# 3. systemd-analyze verify.
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze is missing (package systemd), so the units were not verified"
  ((failures)) && exit 1
  exit 77
fi
mkdir -p "$tmp/units"
to_verify=()
for unit in "$units_dir"/*.service "$units_dir"/*.target; do
  name="$(basename "$unit")"
  sed -E "s#^ExecStart=/usr/local/bin/#ExecStart=$bin/#" "$unit" >"$tmp/units/$name"
  if [[ "$name" == *@.service ]]; then
    instance="${name/@./@0.}"
    ln -s "$name" "$tmp/units/$instance"
    to_verify+=("$tmp/units/$instance")
  else
    to_verify+=("$tmp/units/$name")
  fi
done
(cd "$tmp/units" && systemd-analyze verify --man=no "${to_verify[@]}") >"$tmp/verify.log" 2>&1
rc=$?
if grep -i 'tessera' "$tmp/verify.log" >"$tmp/verify-tessera.log" || ((rc != 0)); then
  cat "$tmp/verify.log"
  fail "systemd-analyze verify (exit $rc) on ${to_verify[*]##*/}"
else
  pass "systemd-analyze verify: ${to_verify[*]##*/}"
fi

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
