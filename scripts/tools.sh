#!/usr/bin/env bash
# Install the pinned developer tools: the protoc plugins that produced gen/go, buf, ghz,
# grpcurl, kubeconform, kube-score, kustomize and the project's OpenTelemetry Collector
# (scripts/collector.sh) (used by `make k8s-check` where kubectl,
# whose built-in kustomize it prefers, is absent). Go tools go to $(go env GOPATH)/bin (where the Makefile and
# scripts/gen.sh look), buf comes from npm. A tool already there at the pinned version is
# skipped, so running this again is cheap. Needs go and npm on PATH.
set -euo pipefail

# Plugin versions must match the "versions:" header of the files in gen/go, or `make
# check-gen` sees a diff.
PROTOC_GEN_GO=v1.36.12      # google.golang.org/protobuf
PROTOC_GEN_GO_GRPC=v1.6.2   # google.golang.org/grpc/cmd/protoc-gen-go-grpc
GHZ=v0.121.0
GRPCURL=v1.9.4
KUBECONFORM=v0.8.0
KUBE_SCORE=v1.20.0
KUSTOMIZE=v5.8.1            # v5.8.3 needs a newer Go than 1.26
BUF=1.75.0                  # npm package @bufbuild/buf

die() { echo "tools.sh: $*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (install Go 1.26 or newer)"
gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"

# go_tool NAME PACKAGE MODULE VERSION: `go install PACKAGE@VERSION` unless $gobin/NAME was
# built from MODULE at VERSION (read from the build info Go embeds in the binary).
go_tool() {
  local name=$1 package=$2 module=$3 version=$4 have=""
  if [ -x "$gobin/$name" ]; then
    have=$(go version -m "$gobin/$name" 2>/dev/null | awk -v m="$module" '$1 == "mod" && $2 == m { print $3 }')
    have=${have:-"another build"}
  fi
  if [ "$have" = "$version" ]; then
    echo "ok       $name $version"
    return
  fi
  echo "install  $name $version (found: ${have:-none})"
  GOBIN="$gobin" go install "$package@$version" || die "go install $package@$version failed"
  have=$(go version -m "$gobin/$name" | awk -v m="$module" '$1 == "mod" && $2 == m { print $3 }')
  [ "$have" = "$version" ] || die "$gobin/$name reports ${have:-no version}, wanted $version"
}

go_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
  google.golang.org/protobuf "$PROTOC_GEN_GO"
go_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC"
go_tool ghz github.com/bojand/ghz/cmd/ghz github.com/bojand/ghz "$GHZ"
go_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl github.com/fullstorydev/grpcurl "$GRPCURL"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform github.com/yannh/kubeconform "$KUBECONFORM"
go_tool kube-score github.com/zegl/kube-score/cmd/kube-score github.com/zegl/kube-score "$KUBE_SCORE"
go_tool kustomize sigs.k8s.io/kustomize/kustomize/v5 sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE"

have=$(buf --version 2>/dev/null || true)
if [ "$have" = "$BUF" ]; then
  echo "ok       buf $BUF"
else
  command -v npm >/dev/null || die "npm is not on PATH (needed for @bufbuild/buf)"
  echo "install  buf $BUF (found: ${have:-none})"
  npm install --global --no-fund --no-audit "@bufbuild/buf@$BUF" || die "npm install @bufbuild/buf@$BUF failed"
  hash -r
  have=$(buf --version 2>/dev/null || true)
  [ "$have" = "$BUF" ] || die "buf on PATH reports '${have:-nothing}', wanted $BUF (is npm's global bin, $(npm prefix --global)/bin, on PATH?)"
fi

bash "$(dirname "$0")/collector.sh"

case ":$PATH:" in
  *":$gobin:"*) ;;
  *) echo "note: add $gobin to PATH to run the Go tools by name" ;;
esac
