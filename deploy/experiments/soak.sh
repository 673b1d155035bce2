#!/usr/bin/env bash
# The soak (not part of deploy/test.sh; ~11 minutes): builds, then runs tessera-soak, 64 concurrent clients
# (valid traffic mixed with malformed and hostile requests, 20 requests/s each) against a scheduler and two
# servers for 10 minutes, printing each daemon's resident memory and open descriptors every 30 s. Exits 1
# when either grew by more than 10% after the first minute, a server's /healthz took longer than 100 ms, or a
# hostile request was accepted. Arguments go to tessera-soak (try --help), e.g. --duration_s=120.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/build.sh >&2
exec "${TESSERA_BUILD_DIR:-build}/bin/tessera-soak" "$@"
