#!/usr/bin/env bash
# Build the fraudmesh container image without a Docker engine, then smoke-test it.
#
#   1. apt-get installs buildah and debootstrap when they are missing;
#   2. a Debian bookworm minbase root filesystem with python3, libgomp1 and ca-certificates
#      is made by debootstrap and imported with buildah as localhost/fraudmesh-base:bookworm
#      (kept in buildah's storage, labelled with its package list; a base with another list
#      is rebuilt, and FRESH_BASE=1 rebuilds it anyway);
#   3. the dependencies' image, localhost/fraudmesh-deps:<key>: the base with every
#      dependency in /opt/fraudmesh (deploy/images/Containerfile.deps), built only when no
#      image of its key is kept (the key hashes requirements.lock, the project's declared
#      dependencies, that file, pip's version and the base; FRESH_DEPS=1 rebuilds it). Its
#      wheels are resolved against requirements.lock and built or downloaded on the host,
#      so nothing in the image compiles and the image build itself is offline;
#   4. the project's own wheel is built on the host, and `buildah bud` builds
#      deploy/images/Containerfile on the dependencies' image (chroot isolation): the
#      user, the wheel and pip's check of every requirement;
#   5. deploy/images/smoke.py runs inside the image with `buildah run` as the image's user,
#      with a published model from $VAR_DIR/models mounted read-only: the scorer and the
#      decision sink must answer SERVING on their gRPC health checks;
#   6. the image is written as an OCI archive to build/images/ and its sizes are printed.
#
# buildah's storage is overlay where the kernel mounts it, vfs otherwise (IMAGE_STORAGE=vfs
# or overlay chooses); the driver used is written to build/images/storage-driver, for the
# commands that read the images afterwards (`buildah --storage-driver "$(cat
# build/images/storage-driver)" push ...`). vfs copies the whole root file system for each
# container and commit: a cold build took 238 s and 252 CPU seconds with it, 172 s and 162
# with overlay, on the same 2-core machine.
#
# Needs root (debootstrap, buildah's storage), the project's .venv (`make install`) and a
# trained model (`make data`). Envoy and Redis use official images referenced by digest in
# deploy/k8s; they are not built here.
set -euo pipefail
cd "$(dirname "$0")/.."

VAR_DIR=${VAR_DIR:-var}
IMAGE=${IMAGE:-localhost/fraudmesh}
BASE_IMAGE=localhost/fraudmesh-base:bookworm
# libgomp1: LightGBM's OpenMP runtime; ca-certificates: TLS to a managed Kafka or Redis.
BASE_PACKAGES=python3,libgomp1,ca-certificates
BASE_LABEL=io.fraudmesh.base.packages
DEPS_IMAGE=localhost/fraudmesh-deps
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PIP_VERSION=26.3
PY=${PY:-.venv/bin/python}
OUT=build/images
CONTEXT=$OUT/context

die() { echo "images.sh: $*" >&2; exit 1; }
step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

[ "$(id -u)" = 0 ] || die "run as root: debootstrap and buildah's storage need it"
[ -x "$PY" ] || die "no $PY: run 'make install' first"
version=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
tag="$IMAGE:$version"

step "tools"
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
buildah --version

# overlay when a container of it mounts here, else vfs.
storage=${IMAGE_STORAGE:-}
if [ -z "$storage" ]; then
  storage=vfs
  if probe=$(buildah --storage-driver overlay from scratch 2>/dev/null); then
    if buildah --storage-driver overlay mount "$probe" >/dev/null 2>&1; then
      storage=overlay
      buildah --storage-driver overlay umount "$probe" >/dev/null 2>&1 || true
    fi
    buildah --storage-driver overlay rm "$probe" >/dev/null 2>&1 || true
  fi
fi
case "$storage" in overlay | vfs) ;; *) die "IMAGE_STORAGE must be overlay or vfs, not $storage" ;; esac
buildah=(buildah --storage-driver "$storage")
mkdir -p "$OUT"
echo "$storage" >"$OUT/storage-driver"
echo "storage driver: $storage"

model=$(find "$VAR_DIR/models" -name model.onnx -print -quit 2>/dev/null || true)
[ -n "$model" ] || die "no model under $VAR_DIR/models: run 'make data' first"

step "base image $BASE_IMAGE"
base_packages=$("${buildah[@]}" inspect --type image \
  --format "{{index .OCIv1.Config.Labels \"$BASE_LABEL\"}}" "$BASE_IMAGE" 2>/dev/null || true)
if [ "${FRESH_BASE:-0}" = 1 ] || [ "$base_packages" != "$BASE_PACKAGES" ]; then
  rootfs=$OUT/rootfs
  rm -rf "$rootfs"
  mkdir -p "$OUT"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$MIRROR" \
    >"$OUT/debootstrap.log" 2>&1 || { tail -20 "$OUT/debootstrap.log" >&2; die "debootstrap failed"; }
  # What an image never needs: downloaded packages, package lists, docs, man pages, locales.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  ctr=$("${buildah[@]}" from scratch)
  mnt=$("${buildah[@]}" mount "$ctr")
  cp -a "$rootfs"/. "$mnt"/
  "${buildah[@]}" umount "$ctr" >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.description="Debian bookworm minbase with $BASE_PACKAGES" \
    --label "$BASE_LABEL=$BASE_PACKAGES" \
    --label org.opencontainers.image.created="$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$ctr"
  "${buildah[@]}" commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
else
  echo "reusing $BASE_IMAGE (FRESH_BASE=1 rebuilds it)"
fi

# The dependencies' image: the base with every dependency installed, built only when none of
# this key is kept. The key hashes what decides its content and nothing of the project's own
# code, so a change of the code rebuilds only the small layer on top of it.
base_id=$("${buildah[@]}" inspect --type image --format '{{.FromImageID}}' "$BASE_IMAGE")
deps_key=$({
  cat requirements.lock deploy/images/Containerfile.deps
  "$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'
  echo "pip $PIP_VERSION, base $base_id"
} | sha256sum | cut -c1-16)
deps_image=$DEPS_IMAGE:$deps_key

# pip itself, run from its wheel by both builds and never installed.
pip_wheel() {
  mkdir -p "$1/pip"
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$1/pip" \
    "pip==$PIP_VERSION"
  mv "$1"/pip/pip-*.whl "$1/pip/pip.whl"
}

# The project's wheel into $1 (with the further pip options given), from an empty build/lib:
# setuptools puts whatever an earlier build left there into the new wheel, and modules that
# left the product (the load-test suite) would ship again.
wheels() {
  rm -rf build/lib build/bdist.*
  "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$1" "${@:2}" .
}

step "dependencies image $deps_image"
if [ "${FRESH_DEPS:-0}" != 1 ] && "${buildah[@]}" inspect --type image "$deps_image" >/dev/null 2>&1; then
  echo "reusing $deps_image (FRESH_DEPS=1 rebuilds it)"
else
  deps_context=$OUT/deps-context
  rm -rf "$deps_context"
  mkdir -p "$deps_context/wheels"
  # Every dependency, resolved against requirements.lock on the host, so nothing compiles in
  # the image and its build is offline.
  wheels "$deps_context/wheels" --constraint requirements.lock
  # Pins whose environment marker the host's Python skips but the image's may need (redis
  # wants async-timeout below Python 3.11.3; bookworm has 3.11.2): the image's pip decides.
  grep -E '^[A-Za-z0-9][^#]*==[^;]*;' requirements.lock | cut -d';' -f1 | tr -d ' ' \
    | xargs -r "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --dest "$deps_context/wheels"
  pip_wheel "$deps_context"
  cp requirements.lock "$deps_context/"
  echo "$(find "$deps_context/wheels" -name '*.whl' | wc -l) wheels, $(du -sh "$deps_context/wheels" | cut -f1)"
  "${buildah[@]}" bud --isolation chroot --layers=false --quiet \
    --build-arg BASE="$BASE_IMAGE" \
    -f deploy/images/Containerfile.deps -t "$deps_image" "$deps_context" >/dev/null
  rm -rf "$deps_context"
  # Every kept image costs its whole size (vfs keeps each layer as a full copy): drop the
  # dependencies' images of other keys.
  "${buildah[@]}" images --format '{{.Name}}:{{.Tag}}' | grep -F "$DEPS_IMAGE:" \
    | grep -vxF "$deps_image" | xargs -r "${buildah[@]}" rmi >/dev/null 2>&1 || true
fi

step "project wheel"
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT/wheels"
wheels "$CONTEXT/wheels" --no-deps
pip_wheel "$CONTEXT"
ls "$CONTEXT/wheels"

step "build $tag"
"${buildah[@]}" bud --isolation chroot --layers=false --quiet \
  --build-arg DEPS="$deps_image" \
  --label org.opencontainers.image.title=fraudmesh \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  -f deploy/images/Containerfile -t "$tag" "$CONTEXT" >/dev/null
# The previous build of the tag is left untagged: drop it (vfs keeps every layer as a full
# copy).
"${buildah[@]}" rmi --prune >/dev/null 2>&1 || true

step "smoke test inside $tag"
# A copy of the published models, readable by the image's user (version folders are
# created private to the user who trained them), mounted for the smoke test only.
models=$OUT/smoke-models
rm -rf "$models"
cp -r "$VAR_DIR/models" "$models"
chmod -R a+rX "$models"
ctr=$("${buildah[@]}" from --quiet "$tag")
trap '"${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
"${buildah[@]}" run --isolation chroot --user 10001:10001 \
  -v "$PWD/$models:/var/lib/fraudmesh/models:ro" \
  -v "$PWD/deploy/images/smoke.py:/opt/smoke/smoke.py:ro" \
  "$ctr" -- python /opt/smoke/smoke.py

step "archive and sizes"
archive="$OUT/fraudmesh-$version.oci.tar"
rm -f "$archive"
"${buildah[@]}" push --quiet "$tag" "oci-archive:$archive:$tag" >/dev/null
"${buildah[@]}" images --format '{{.Name}}:{{.Tag}}  {{.Size}}' | grep -E "fraudmesh(-base)?:" || true
echo "$archive  $(du -h "$archive" | cut -f1) (compressed layers, as a registry stores them)"
echo "done in ${SECONDS}s"
