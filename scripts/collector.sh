#!/usr/bin/env bash
# Build the project's OpenTelemetry Collector, otelcol-fraudmesh, offline with the pinned
# collector builder from deploy/observability/collector/builder-config.yaml, into
# $(go env GOPATH)/bin beside the other tools. From nothing the build fetches about 500 MB of
# modules and compiles for about 3 CPU-minutes (docs/observability.md has the figures); it is
# skipped while the binary there was built from the same builder config and exporter sources
# (their digest is kept next to it), and Go's module and build caches make a rebuild after a
# change cheap (under half a minute). The mesh runs without the collector: it is optional.
set -euo pipefail
cd "$(dirname "$0")/../deploy/observability/collector"

BUILDER=v0.150.0   # go.opentelemetry.io/collector/cmd/builder; the components' versions live in the config

die() { echo "collector.sh: $*" >&2; exit 1; }
command -v go >/dev/null || die "go is not on PATH"
gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
binary="$gobin/otelcol-fraudmesh"
digest=$(cat builder-config.yaml jsonfileexporter/go.mod jsonfileexporter/go.sum jsonfileexporter/*.go \
  | sha256sum | cut -d' ' -f1)
if [ -x "$binary" ] && [ "$(cat "$binary.sha256" 2>/dev/null)" = "$digest" ]; then
  echo "ok       otelcol-fraudmesh ($digest)"
  exit 0
fi

builder="$gobin/builder"
have=""
[ -x "$builder" ] && have=$(go version -m "$builder" | awk '$1 == "mod" { print $3 }')
if [ "$have" != "$BUILDER" ]; then
  echo "install  collector builder $BUILDER (found: ${have:-none})"
  GOBIN="$gobin" go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER" \
    || die "go install of the collector builder failed"
fi

echo "build    otelcol-fraudmesh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The config names the project's exporter by a path relative to this folder.
"$builder" --config builder-config.yaml --output-path "$out" >"$out.log" 2>&1 \
  || { tail -30 "$out.log" >&2; die "the collector build failed (log above)"; }
rm -f "$out.log"
install -m 0755 "$out/otelcol-fraudmesh" "$binary"
echo "$digest" >"$binary.sha256"
echo "built    $binary"
