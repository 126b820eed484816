#!/usr/bin/env bash
# Runs kcr's whole test suite, end-to-end tests included, as root on a fresh
# Linux machine: installs CRIU, starts a real Apache Kafka broker on loopback,
# runs every Go test, and stops the broker again.
#
#   sudo scripts/test.sh            # everything
#   sudo scripts/test.sh -run Foo   # extra go test flags
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
export KCR_E2E=1 GOFLAGS="${GOFLAGS:-} -buildvcs=false"

scripts/install-criu.sh
scripts/install-runc.sh
# Podman 5 and containerd 2 for test/e2e's runtime tests (docs/runtimes.md).
scripts/install-podman.sh
scripts/install-containerd.sh
scripts/containerd-up.sh >/dev/null
scripts/kafka-up.sh
trap 'scripts/kafka-down.sh >/dev/null 2>&1 || true; scripts/containerd-down.sh || true' EXIT
export KCR_KAFKA_BROKERS="${KCR_KAFKA_BROKERS:-127.0.0.1:${KCR_KAFKA_PORT:-9092}}"

# One package at a time: the end-to-end tests restore processes at their
# original PIDs, and parallel packages would compete for CPU and PIDs.
go vet ./...
go test -race -p 1 -count=1 -timeout 25m "$@" ./...
