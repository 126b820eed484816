#!/usr/bin/env bash
# kcr standby's Kafka wake (package kafkawake), measured on a real broker:
# the broker requests per second of a watcher whose group has nothing to do
# (a sleeping service), and the detection latency, from the start of a
# produce call to the watcher seeing the record. Both modes: the default
# long-polling fetch (--poll 0) and polling (--poll 100ms). The wake only:
# no CRIU, no service.
#
#   scripts/bench-wake.sh [wakes]     (default 50)
#
# Environment: KCR_KAFKA_BROKERS (default 127.0.0.1:9092),
# KCR_BENCH_ASLEEP (seconds to count the requests of the idle watcher,
# default 60), KCR_BENCH_POLLS (the modes, default "0 100ms").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_go
wakes="${1:-50}"
brokers="${KCR_KAFKA_BROKERS:-127.0.0.1:9092}"
asleep="${KCR_BENCH_ASLEEP:-60}"
polls="${KCR_BENCH_POLLS:-0 100ms}"
start_work kcr-bench-wake ""
GOFLAGS=-buildvcs=false go build -o "$work/wakebench" ./test/apps/wakebench
echo "bench-wake: $(date -u +%F) $(git rev-parse --short HEAD) load: $(cut -d' ' -f1-3 /proc/loadavg)"
for p in $polls; do
	"$work/wakebench" -brokers "$brokers" -poll "$p" -wakes "$wakes" -asleep "${asleep}s"
done
