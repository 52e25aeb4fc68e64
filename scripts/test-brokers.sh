#!/usr/bin/env bash
# Installs what the event-log tests run against, idempotently: redis-server, Java and Maven
# from the OS packages when missing, and the jars of a Kafka 4.x broker (deploy/kafka/pom.xml,
# from Maven Central) into build/kafka/libs, fetched again only when the pom changes.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing ${need[*]}: install them with apt-get install ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}"
fi

libs=build/kafka/libs
stamp=build/kafka/.fetched
if [ ! -f "$stamp" ] || [ deploy/kafka/pom.xml -nt "$stamp" ]; then
  rm -rf "$libs"
  mkdir -p "$libs"
  mvn -q -B -Dstyle.color=never -f deploy/kafka/pom.xml dependency:copy-dependencies \
    -DoutputDirectory="$PWD/$libs" -Dmdep.useRepositoryLayout=false
  ls "$libs"/kafka_2.13-*.jar >/dev/null
  touch "$stamp"
fi
