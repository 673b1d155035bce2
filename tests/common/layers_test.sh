#!/usr/bin/env bash
# The layers of common/ (common/CMakeLists.txt), one folder each: base, model, rpc, daemon. A file includes only
# files of its own layer or of the layers below it, and only the libraries its layer links; no source lies in
# common/ outside a layer's folder (common/fabric/, the UCX transport, is a library above rpc of its own).
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A rank=([base]=0 [model]=1 [rpc]=2 [daemon]=3)
# Library headers a layer may not include below the layer that links the library.
declare -A forbidden=(
  [base]='^(grpcpp/|grpc/|google/protobuf/|proto/|nlohmann/|openssl/|httplib\.h|gflags/)'
  [model]='^(grpcpp/|grpc/|proto/.*\.grpc\.pb\.h|openssl/|httplib\.h|gflags/)'
  [rpc]='^(httplib\.h)'
  [daemon]='^$')
failures=0
checked=0
for file in common/*.h common/*.cc; do
  [[ -e "$file" ]] || continue
  echo "$file: in no layer (move it into the folder of its layer: common/base, model, rpc or daemon)"
  failures=$((failures + 1))
done
for layer in base model rpc daemon; do
  for file in common/"$layer"/*.h common/"$layer"/*.cc; do
    [[ -e "$file" ]] || continue
    checked=$((checked + 1))
    while read -r included; do
      if [[ "$included" == common/* ]]; then
        [[ "$included" == common/version_commit.h ]] && continue
        other="$(cut -d/ -f2 <<<"$included")"
        if [[ -z "${rank[$other]:-}" ]]; then
          echo "$file includes $included, which is in no layer"
          failures=$((failures + 1))
        elif ((rank[$other] > rank[$layer])); then
          echo "$file ($layer) includes $included ($other): a layer uses only the layers below it"
          failures=$((failures + 1))
        fi
      elif [[ "$included" =~ ${forbidden[$layer]} && "${forbidden[$layer]}" != '^$' ]]; then
        echo "$file ($layer) includes $included, a library its layer does not link"
        failures=$((failures + 1))
      fi
    done < <(sed -n -E 's/^#include [<"]([^>"]+)[>"].*/\1/p' "$file")
  done
done
if ((failures > 0)); then
  echo "FAIL: $failures include(s) or file(s) break the layers"
  exit 1
fi
echo "PASS: ${checked} files of common/ keep to their layers"
