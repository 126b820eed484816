#!/usr/bin/env bash
# Runs kcr's whole test suite, end-to-end tests included, as root on a fresh
# Linux machine: installs CRIU, starts two real Apache Kafka brokers on
# loopback, runs every Go test, and stops the brokers again. The fast broker
# (KCR_KAFKA_BROKERS, port 9092) answers a group's first join at once; the
# production-defaults one (KCR_KAFKA_PROD_BROKERS, port KCR_KAFKA_PROD_PORT,
# default 9094) keeps Kafka's group.initial.rebalance.delay.ms of 3000 ms, for
# the tests that depend on it. A third, a 3-broker cluster on 127.0.1.1-3
# (KCR_KAFKA_BROKERS_N=3: PLAINTEXT, SASL_SSL with SCRAM-SHA-512 and with
# OAUTHBEARER; KCR_KAFKA_CLUSTER_HOME, default /var/tmp/kcr-kafka-cluster,
# base port KCR_KAFKA_CLUSTER_PORT, default 9192), serves the TestCluster*
# tests.
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
# The kubelet for test/e2e/kubelet_test.go, which starts and stops it
# (kubelet-up.sh, kubelet-down.sh), then the control plane for
# test/e2e/kube_cluster_test.go (kube-up.sh, kube-down.sh, the kubelet
# registered as its node): built from the Go module proxy once (minutes),
# then cached by version; one after the other (they share most packages),
# while the brokers start.
{
	scripts/install-kubelet.sh >/dev/null || exit 1
	scripts/install-kube-control-plane.sh >/dev/null || exit 2
} &
kube=$!
prod_port=${KCR_KAFKA_PROD_PORT:-9094}
prod_env=(KCR_KAFKA_PROD=1 KCR_KAFKA_PORT="$prod_port"
	KCR_KAFKA_CONTROLLER_PORT="${KCR_KAFKA_PROD_CONTROLLER_PORT:-9095}"
	KCR_KAFKA_HOME="${KCR_KAFKA_PROD_HOME:-/var/tmp/kcr-kafka-prod}")
cluster_env=(KCR_KAFKA_BROKERS_N=3 KCR_KAFKA_PORT="${KCR_KAFKA_CLUSTER_PORT:-9192}"
	KCR_KAFKA_HOME="${KCR_KAFKA_CLUSTER_HOME:-/var/tmp/kcr-kafka-cluster}")
trap 'scripts/kubelet-down.sh >/dev/null 2>&1 || true; scripts/kube-down.sh >/dev/null 2>&1 || true; scripts/kafka-down.sh >/dev/null 2>&1 || true; env "${prod_env[@]}" scripts/kafka-down.sh >/dev/null 2>&1 || true; env "${cluster_env[@]}" scripts/kafka-down.sh >/dev/null 2>&1 || true; scripts/containerd-down.sh || true' EXIT
scripts/containerd-up.sh >/dev/null
# The brokers start at once (each JVM takes 256-512 MiB of heap).
scripts/kafka-up.sh &
fast=$!
env "${prod_env[@]}" scripts/kafka-up.sh &
prod=$!
env "${cluster_env[@]}" scripts/kafka-up.sh &
cluster=$!
# go vet needs no broker: it runs while they start.
go vet ./...
wait "$fast"
wait "$prod"
wait "$cluster"
wait "$kube" || case $? in
1) die "the kubelet did not build (scripts/install-kubelet.sh)" ;;
*) die "the control plane did not build (scripts/install-kube-control-plane.sh)" ;;
esac
export KCR_KAFKA_BROKERS="${KCR_KAFKA_BROKERS:-127.0.0.1:${KCR_KAFKA_PORT:-9092}}"
export KCR_KAFKA_PROD_BROKERS="${KCR_KAFKA_PROD_BROKERS:-127.0.0.1:$prod_port}"
export KCR_KAFKA_CLUSTER_HOME="${KCR_KAFKA_CLUSTER_HOME:-/var/tmp/kcr-kafka-cluster}"

# One package at a time: the end-to-end tests restore processes at their
# original PIDs, and parallel packages would compete for CPU and PIDs.
# go test -json: the console shows each package's result and each failed
# test's name as they come; at the end, the slowest tests (where the time
# goes) and, after a failure, the failed tests' output, their assertions
# last (a CI summary shows only the head and tail of a log).
json=$(mktemp /var/tmp/kcr-test.XXXXXX.json)
rc=0
go test -json -race -p 1 -count=1 -timeout 40m "$@" ./... | tee "$json" |
	jq -j --unbuffered 'select((.Action == "output" and (.Test == null or (.Output | test("^\\s*--- FAIL")))) or .Action == "build-output") | .Output' ||
	rc=$?
echo "test.sh: the slowest tests (s):"
jq -r 'select((.Action == "pass" or .Action == "fail") and .Test != null and (.Test | contains("/") | not)) | "\(.Elapsed)\t\(.Package | sub(".*/kcr/"; ""))\t\(.Test)"' "$json" |
	sort -rn | awk 'NR <= 15'
if ((rc != 0)); then
	failed='(map(select(.Action == "fail" and .Test != null) | "\(.Package) \(.Test)") | unique) as $f | .[] | select(.Action == "output" and .Test != null) | select("\(.Package) \(.Test)" as $k | $f | index($k)) | .Output'
	echo "test.sh: the failed tests' output (the whole run's in $json):"
	jq -j -s "$failed" "$json" | grep -v -e '^=== ' | cut -c1-400 | tail -n 300
	echo "test.sh: the failed tests' assertions and logs:"
	jq -j -s "$failed" "$json" | grep -E -e '--- FAIL|_test\.go:[0-9]+: |^panic:' | grep -v -e '-> exit 0$' | cut -c1-400 | tail -n 60
	exit "$rc"
fi
rm -f "$json"
# The fault-injection soak of kcr standby, short mode (~3 min), on the fast
# broker (which it pauses): with a fixed seed, so that a failure can be
# replayed (KCR_SOAK_SEED).
echo "test.sh: go test done, $SECONDS s into test.sh"
if (($# == 0)); then
	KCR_SOAK_SEED="${KCR_SOAK_SEED:-20261206}" scripts/soak-standby.sh
fi
