# Sourced by the experiment scripts: moves to the repository root, builds the binaries when they are missing,
# and sets `bin` to their folder (TESSERA_BUILD_DIR/bin, default build/bin).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin="${TESSERA_BUILD_DIR:-build}/bin"
[[ -x "$bin/tessera-launch" ]] || bash deploy/build.sh
