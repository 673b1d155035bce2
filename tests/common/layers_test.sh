#!/usr/bin/env bash
# The layers of common/ (common/CMakeLists.txt): a file includes only files of its own layer or of the layers
# below it, and only the libraries its layer links. Usage: layers_test.sh LAYERS_FILE (written by CMake: one
# "layer header" line per file).
set -euo pipefail
cd "$(dirname "$0")/../.."
layers_file="$1"
declare -A layer_of
while read -r layer header; do
  [[ -n "$layer" ]] && layer_of["$header"]="$layer"
done <"$layers_file"
declare -A rank=([base]=0 [model]=1 [rpc]=2 [daemon]=3)
# Library headers a layer may not include below the layer that links the library.
declare -A forbidden=(
  [base]='^(grpcpp/|grpc/|google/protobuf/|proto/|nlohmann/|openssl/|httplib\.h|gflags/)'
  [model]='^(grpcpp/|grpc/|proto/.*\.grpc\.pb\.h|openssl/|httplib\.h|gflags/)'
  [rpc]='^(httplib\.h)'
  [daemon]='^$')
failures=0
for file in common/*.h common/*.cc; do
  name="$(basename "$file")"
  header="${name%.cc}"
  [[ "$header" == "$name" ]] || header="$header.h"
  layer="${layer_of[$header]:-}"
  if [[ -z "$layer" ]]; then
    echo "$file: in no layer (add it to a layer's list in common/CMakeLists.txt)"
    failures=$((failures + 1))
    continue
  fi
  while read -r included; do
    if [[ "$included" == common/* ]]; then
      [[ "$included" == common/version_commit.h ]] && continue
      other="${layer_of[${included#common/}]:-}"
      if [[ -z "$other" ]]; then
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
if ((failures > 0)); then
  echo "FAIL: $failures include(s) break the layers"
  exit 1
fi
echo "PASS: ${#layer_of[@]} files of common/ keep to their layers"
