#!/usr/bin/env bash
# Fetches the jars of the Kafka 4.x broker the event-log tests run (deploy/kafka/pom.xml, from
# Maven Central) into build/kafka/libs, again only when the pom changes. Java and Maven come
# from scripts/system-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

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
