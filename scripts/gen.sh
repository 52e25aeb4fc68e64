#!/usr/bin/env bash
# Regenerate every stub from protos/ into the directory given (default: gen/).
# Python (+ .pyi, + grpc) comes from grpcio-tools; Go from buf with protoc-gen-go and
# protoc-gen-go-grpc. Versions are pinned (requirements.lock, scripts/tools.sh), so the
# output is reproducible and `make check-gen` can diff it against the committed copy.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gen}"
py="${PYTHON:-$PWD/.venv/bin/python}"
gobin="$(go env GOPATH)/bin"

rm -rf "$out/python" "$out/go"
mkdir -p "$out/python" "$out/go"
mapfile -t protos < <(cd protos && find . -name '*.proto' -printf '%P\n' | LC_ALL=C sort)
(cd protos && "$py" -m grpc_tools.protoc -I . \
  --python_out="../$out/python" --pyi_out="../$out/python" --grpc_python_out="../$out/python" \
  "${protos[@]}") 2>&1 | grep -v "^$" || true
[ -f "$out/python/fraud/v1/scoring_pb2.py" ] || { echo "python generation failed" >&2; exit 1; }
PATH="$gobin:$PATH" buf generate protos --template protos/buf.gen.yaml --output "$out/go"
