#!/usr/bin/env bash
# Fault-injection soak of kcr standby on a real broker: two services
# (franz-go's kgoapp; kafka-go's kafkaapp under --listen, socket-activated),
# each under a kcr standby that a wrapper restarts 500 ms after it exits, as
# systemd's Restart=always would. Orders (records, and connections to the
# --listen address) come at random; faults are injected at random moments:
# SIGKILL of kcr standby (at random, or a random time into a checkpoint or a
# restore it was asked for), SIGKILL of the service, the broker paused
# (SIGSTOP) and, in the long mode, stopped and started (its data kept), a full image
# directory (a 96 MiB tmpfs filled up), a slow before-checkpoint hook (8 s),
# and wake storms (lag, connections, kcr standby wake and SIGUSR1 at once).
# An independent reader (test/soak) checks, all along and at the end: never
# two copies of a service alive (processes; group members for longer than a
# session timeout), every order answered exactly once (a duplicate passes
# only when a fault that loses commits explains it: the service killed, or
# the broker paused or restarted, overlapping its two processings),
# the service answering again within the bound after each fault (after a
# broker restart, counted from when the broker answers again; the broker's
# own restart time is reported apart), and nothing left behind (copies,
# images, temporaries, more bad images than --keep-bad, group members).
#
#   sudo scripts/soak-standby.sh          short mode, ~3 min (CI)
#   sudo scripts/soak-standby.sh long     1,000 cycles and >= 200 faults
#
# Environment: KCR_KAFKA_BROKERS (default 127.0.0.1:9092), KCR_KAFKA_HOME,
# KCR_KAFKA_PORT and KCR_KAFKA_CONTROLLER_PORT (the broker's, for the pause
# and, in the long mode, its restarts with scripts/kafka-down.sh and
# kafka-up.sh), KCR_SOAK_SEED (random seed), KCR_SOAK_MAX_TIME (long mode's
# time limit, default 4h), KCR_SOAK_BOUND (recovery bound, default 90s),
# KCR_SOAK_BROKER_BOUND (recovery bound after a broker restart, from when the
# broker answers again, default 30s), KCR_SOAK_RESTART_EVERY (long mode: one
# fault in this many is a broker restart, default 25), KCR_SOAK_KEEP=1 keeps
# the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_run
mode="${1:-short}"
brokers="${KCR_KAFKA_BROKERS:-127.0.0.1:9092}"
case "$mode" in
short) args=(-cycles 40 -faults 20 -max-time 150s) ;;
long) args=(-cycles 1000 -faults 200 -max-time "${KCR_SOAK_MAX_TIME:-4h}" -broker-restarts
	-broker-restart-every "${KCR_SOAK_RESTART_EVERY:-25}") ;;
*) die "unknown mode '$mode': short or long" ;;
esac
start_work kcr-soak-standby "${KCR_SOAK_KEEP:-}"
bin="$work/bin"
build_bins "$bin" cmd/kcr test/apps/kgoapp test/apps/kafkaapp test/soak
kenv="KCR_KAFKA_HOME=${KCR_KAFKA_HOME:-/var/tmp/kcr-kafka},KCR_KAFKA_PORT=${KCR_KAFKA_PORT:-9092}"
kenv+=",KCR_KAFKA_CONTROLLER_PORT=${KCR_KAFKA_CONTROLLER_PORT:-9093},KCR_KAFKA_KEEP_DATA=1"
"$bin/soak" -kcr "$bin/kcr" -kgoapp "$bin/kgoapp" -kafkaapp "$bin/kafkaapp" -repo "$PWD" \
	-brokers "$brokers" -kafka-env "$kenv" -work "$work/run" -seed "${KCR_SOAK_SEED:-0}" \
	-bound "${KCR_SOAK_BOUND:-90s}" -broker-bound "${KCR_SOAK_BROKER_BOUND:-30s}" "${args[@]}"
