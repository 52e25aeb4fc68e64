#!/usr/bin/env bash
# Make sure the system programs the tests start are present: redis-server (Redis online
# store, event log), util-linux setpriv (how the mesh launches its children), Java and Maven
# (the Kafka broker of the event-log tests), curl with HTTP/2 (the raw calls with metadata no
# gRPC library sends, in the hostile-input test), promtool (the alert rules' unit tests),
# Chromium (the web console's browser tests, driven by Playwright without downloading a
# browser of its own), npm (the console's pinned assets), Prometheus (the observability
# processes of `fraudmesh up`; the console's overview is checked against it), bubblewrap
# (the pod test runs each container under a read-only root with only its mounts writable). Missing
# ones are installed from Debian's packages when running as root with apt-get; otherwise
# this says exactly what to install and fails.
set -euo pipefail

# program → Debian package
declare -A wanted=(
  [redis-server]=redis-server
  [setpriv]=util-linux
  [java]=openjdk-17-jre-headless
  [mvn]=maven
  [curl]=curl
  [chromium]=chromium
  [npm]=npm
  [prometheus]=prometheus
  [promtool]=prometheus
  [bwrap]=bubblewrap
)

missing=()
for program in "${!wanted[@]}"; do
  command -v "$program" >/dev/null || missing+=("${wanted[$program]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "system-deps.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's prometheus package would start a system-wide server on :9090, where the mesh
  # starts its own: no service starts during the installation (policy-rc.d says no, as in
  # container images, which ship one already).
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  # shellcheck disable=SC2046 # one word per package
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u)
else
  echo "system-deps.sh: missing system packages: ${missing[*]}" >&2
  echo "  install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
