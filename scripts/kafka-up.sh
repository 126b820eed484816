#!/usr/bin/env bash
# Start a real, single-node Apache Kafka broker (KRaft: one JVM acting as broker
# and controller) on 127.0.0.1, for integration tests.
#
# The broker is assembled from Maven Central artifacts (scripts/kafka/pom.xml),
# cached under $KCR_KAFKA_HOME, and run on the machine's Java 17. The first run
# downloads ~45 MB of jars (+ ~25 MB of Maven plugins) with mvn into
# $KCR_KAFKA_HOME/m2; later runs do not touch the network.
#
# Idempotent: if our broker is already running and answers, it returns at once.
# Otherwise it formats a fresh data dir (or, with KCR_KAFKA_KEEP_DATA=1, reuses
# the one a previous start left), starts the broker in the background and
# waits until it answers real Admin requests (metadata + group coordinator).
# Prints one line on stdout: the broker address and the time taken.
#
# Two flavours:
#   default          the fast test broker: group.initial.rebalance.delay.ms=0, so
#                    that a group's first join is answered at once (short tests).
#   KCR_KAFKA_PROD=1 Kafka's own group settings (group.initial.rebalance.delay.ms
#                    stays at its default, 3000 ms: an empty group's first join
#                    waits 3 s), for the benchmarks, the demo's real-broker mode
#                    and the e2e tests that depend on that delay. Other defaults:
#                    port 9094, controller 9095, home /var/tmp/kcr-kafka-prod.
#                    scripts/test.sh starts both (KCR_KAFKA_PROD_BROKERS).
#
# Share groups (KIP-932): every flavour has them. Kafka 4.2+ formats its
# storage with the share.version feature at 1 (the broker log says "setting
# feature share.version to 1"); the share coordinator's state topic
# (__share_group_state) gets 1 partition here (6 in the cluster) instead of
# Kafka's 50, so that the first share group does not wait for 50 to be
# created. A share group starts at the end of its topics unless its
# share.auto.offset.reset group config is "earliest" (docs/share-groups.md).
#
# Cluster mode: KCR_KAFKA_BROKERS_N=3 starts three KRaft nodes in parallel on
# 127.0.1.1-3 (RF 3, min.insync.replicas=2, Kafka's group settings) with
# PLAINTEXT, SASL_SSL/SCRAM-SHA-512 and SASL_SSL/OAUTHBEARER listeners; see
# scripts/kafka/cluster.sh for its ports, home and files. KCR_KAFKA_NODE=N
# (with KCR_KAFKA_BROKERS_N=3 and KCR_KAFKA_KEEP_DATA=1) starts node N alone
# again, as tests that stop one broker do.
#
# Environment overrides:
#   KCR_KAFKA_HOME             cache + data dir          (default /var/tmp/kcr-kafka)
#   KCR_KAFKA_PORT             PLAINTEXT listener port   (default 9092)
#   KCR_KAFKA_CONTROLLER_PORT  KRaft controller port     (default 9093)
#   KCR_KAFKA_TIMEOUT          seconds to wait for ready (default 90)
#   KCR_KAFKA_VERSION          Kafka version from Maven Central (default 4.3.2)
#   KCR_KAFKA_JAVA             java binary (default /usr/bin/java, else java on PATH)
#   KCR_KAFKA_HEAP_OPTS        JVM heap flags            (default "-Xms256m -Xmx512m")
#   KCR_KAFKA_SERVER_PROPS     extra server.properties lines appended verbatim
#   KCR_KAFKA_KEEP_DATA=1      keep data/ (topics, committed offsets) from the last
#                              start instead of wiping it; tests use it to restart
#                              the broker. Formats as usual when there is none.
#
# Files: $KCR_KAFKA_HOME/broker.log (broker output; the previous one in broker.log.1, or appended to on a restart with KCR_KAFKA_KEEP_DATA=1), kafka.pid, server.properties,
#        data/ (log.dirs, wiped on every start unless KCR_KAFKA_KEEP_DATA=1),
#        dist/kafka-<version>/lib (jars).
# Stop with scripts/kafka-down.sh (same environment).
set -euo pipefail

t_start=${EPOCHREALTIME:-$(date +%s.%N)}
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/kafka/common.sh
. "$script_dir/kafka/common.sh"
# shellcheck source=scripts/kafka/cluster.sh
. "$script_dir/kafka/cluster.sh"

KAFKA_VERSION=${KCR_KAFKA_VERSION:-4.3.2}
PROD=${KCR_KAFKA_PROD:-0}
[[ $PROD == 0 || $PROD == 1 ]] || { echo "kafka-up: ERROR: KCR_KAFKA_PROD must be 0 or 1 (got '$PROD')" >&2; exit 1; }
if ((PROD)); then
	KHOME=${KCR_KAFKA_HOME:-/var/tmp/kcr-kafka-prod}
	PORT=${KCR_KAFKA_PORT:-9094}
	CPORT=${KCR_KAFKA_CONTROLLER_PORT:-9095}
	# Kafka's default: an empty group's first join waits for more members.
	GROUP_PROPS="# group.initial.rebalance.delay.ms: Kafka's default (3000), as in production"
	FLAVOUR="production group settings"
else
	KHOME=${KCR_KAFKA_HOME:-/var/tmp/kcr-kafka}
	PORT=${KCR_KAFKA_PORT:-9092}
	CPORT=${KCR_KAFKA_CONTROLLER_PORT:-9093}
	GROUP_PROPS="group.initial.rebalance.delay.ms=0"
	FLAVOUR="group.initial.rebalance.delay.ms=0"
fi
HOST=127.0.0.1
JARHOME=
if ((CLUSTER_N > 1)); then
	cluster_defaults
	((PROD == 0)) || die "KCR_KAFKA_PROD=1 is implied by KCR_KAFKA_BROKERS_N=3"
	GROUP_PROPS=
	FLAVOUR="3-node cluster, production group settings"
	mkdir -p "$CBASE"
	CBASE=$(cd "$CBASE" && pwd)
	JARHOME=$CBASE
	KHOME=$CBASE
	if [[ -n $CLUSTER_NODE ]]; then
		KHOME=$CBASE/node$CLUSTER_NODE
		HOST=127.0.1.$CLUSTER_NODE
		FLAVOUR="node $CLUSTER_NODE of 3, production group settings"
	fi
fi
TIMEOUT=${KCR_KAFKA_TIMEOUT:-90}
HEAP_OPTS=${KCR_KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}
BOOTSTRAP=$HOST:$PORT

log() { echo "kafka-up: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() {
	local now=${EPOCHREALTIME:-$(date +%s.%N)}
	awk -v a="$t_start" -v b="$now" 'BEGIN { printf "%.1fs", b - a }'
}

[[ $PORT =~ ^[0-9]+$ && $CPORT =~ ^[0-9]+$ ]] || die "ports must be numbers (got '$PORT', '$CPORT')"
[[ $PORT != "$CPORT" ]] || die "KCR_KAFKA_PORT and KCR_KAFKA_CONTROLLER_PORT must differ"

# --- java -------------------------------------------------------------------
JAVA=${KCR_KAFKA_JAVA:-}
if [[ -z $JAVA ]]; then
	if [[ -x /usr/bin/java ]]; then JAVA=/usr/bin/java; else JAVA=$(command -v java || true); fi
fi
[[ -n $JAVA && -x $JAVA ]] || die "no java found (Kafka ${KAFKA_VERSION} needs Java 17+); set KCR_KAFKA_JAVA"
java_major=$("$JAVA" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ { print $2 }')
[[ ${java_major%%.*} =~ ^[0-9]+$ && ${java_major%%.*} -ge 17 ]] ||
	die "$JAVA is Java '${java_major}', Kafka ${KAFKA_VERSION} needs Java 17+; set KCR_KAFKA_JAVA"

mkdir -p "$KHOME"
KHOME=$(cd "$KHOME" && pwd)
JARHOME=${JARHOME:-$KHOME}
PIDFILE=$KHOME/kafka.pid
LOGFILE=$KHOME/broker.log
CONF=$KHOME/server.properties
DATA=$KHOME/data
DIST=$JARHOME/dist/kafka-$KAFKA_VERSION
LIB=$DIST/lib

# Serialise concurrent kafka-up / kafka-down calls on the same home.
exec 9>"$KHOME/.lock"
if command -v flock >/dev/null 2>&1; then
	flock -w "$TIMEOUT" 9 || die "another kafka-up/kafka-down holds $KHOME/.lock"
fi

# --- jars (cached) ----------------------------------------------------------
pom_src=$script_dir/kafka/pom.xml
probe_src=$script_dir/kafka/KafkaProbe.java
[[ -f $pom_src && -f $probe_src ]] || die "missing $pom_src or $probe_src"
cache_key="$KAFKA_VERSION $(sha256sum <"$pom_src" | cut -d' ' -f1)"

if [[ ! -f $DIST/.complete || $(cat "$DIST/.complete") != "$cache_key" ]]; then
	if ! command -v mvn >/dev/null 2>&1; then
		if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
			log "mvn not found; installing Debian package maven"
			{ apt-get install -y -q --no-install-recommends maven ||
				{ apt-get update -q && apt-get install -y -q --no-install-recommends maven; }; } >"$KHOME/apt.log" 2>&1 ||
				die "could not install maven (see $KHOME/apt.log)"
		else
			die "mvn is needed once to fetch the Kafka jars from Maven Central"
		fi
	fi
	log "fetching Kafka ${KAFKA_VERSION} jars from Maven Central into $LIB (first run only)"
	rm -rf "$DIST"
	mkdir -p "$DIST"
	cp "$pom_src" "$DIST/pom.xml"
	if ! (cd "$DIST" && mvn -B -q -f "$DIST/pom.xml" \
		-Dmaven.repo.local="$JARHOME/m2" \
		-Dkafka.version="$KAFKA_VERSION" \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB.tmp") \
		>"$DIST/mvn.log" 2>&1 </dev/null; then
		tail -n 30 "$DIST/mvn.log" >&2 || true
		die "mvn could not fetch Kafka ${KAFKA_VERSION} (full log: $DIST/mvn.log)"
	fi
	ls "$LIB.tmp/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null 2>&1 || die "kafka_2.13-${KAFKA_VERSION}.jar missing after mvn"
	mv "$LIB.tmp" "$LIB"
	rm -rf "$DIST/target"
	echo "$cache_key" >"$DIST/.complete"
fi
CP="$LIB/*"

# Log4j2 configs: broker logs to stdout (redirected to broker.log); tools only errors.
cat >"$KHOME/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.netclient.name = org.apache.kafka.clients.NetworkClient
logger.netclient.level = WARN
EOF
cat >"$KHOME/log4j2-tools.properties" <<'EOF'
status = error
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = ERROR
rootLogger.appenderRef.err.ref = ERR
EOF
TOOL_OPTS=(-Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
	-Djava.awt.headless=true "-Dlog4j2.configurationFile=file:$KHOME/log4j2-tools.properties")

# --- readiness probe (real Admin requests, see scripts/kafka/KafkaProbe.java) -----
probe_dir=$DIST/probe
probe_key=$(sha256sum <"$probe_src" | cut -d' ' -f1)
if [[ ! -f $probe_dir/KafkaProbe.class || $(cat "$probe_dir/.key" 2>/dev/null) != "$probe_key" ]]; then
	javac=$(dirname "$(readlink -f "$JAVA")")/javac
	rm -rf "$probe_dir"
	if [[ -x $javac ]]; then
		mkdir -p "$probe_dir"
		"$javac" -nowarn --release 17 -cp "$CP" -d "$probe_dir" "$probe_src" >&2 ||
			die "could not compile $probe_src"
		echo "$probe_key" >"$probe_dir/.key"
	fi
fi
probe() { # probe <timeout-seconds> [pid]
	if [[ -f $probe_dir/KafkaProbe.class ]]; then
		"$JAVA" "${TOOL_OPTS[@]}" -cp "$CP:$probe_dir" KafkaProbe "$BOOTSTRAP" "$@"
	else # no javac: Java 11+ single-file source launcher
		"$JAVA" "${TOOL_OPTS[@]}" -cp "$CP" "$probe_src" "$BOOTSTRAP" "$@"
	fi
}

if ((CLUSTER_N > 1)) && [[ -z $CLUSTER_NODE ]]; then
	cluster_up # see scripts/kafka/cluster.sh; exits
fi

# --- already running? -----------------------------------------------------------
mapfile -t running < <(our_pids)
if ((${#running[@]})); then
	t=$TIMEOUT
	((t > 15)) && t=15
	if info=$(probe "$t" "${running[0]}" 2>/dev/null); then
		echo "${running[0]}" >"$PIDFILE"
		echo "kafka: broker $BOOTSTRAP already running (pid ${running[0]}, Kafka ${KAFKA_VERSION}, $FLAVOUR, $info), answered in $(elapsed)"
		exit 0
	fi
	log "broker pid(s) ${running[*]} do not answer on $BOOTSTRAP; restarting"
	stop_pids "${running[@]}"
fi
rm -f "$PIDFILE"

if port_open "$PORT" "$HOST"; then
	if info=$(probe 5 2>/dev/null); then
		echo "kafka: broker $BOOTSTRAP already running (not started from $KHOME, $info), answered in $(elapsed)"
		exit 0
	fi
	die "$HOST:$PORT is in use by something that is not a Kafka broker (set KCR_KAFKA_PORT)"
fi
port_open "$CPORT" "$HOST" && die "controller port $HOST:$CPORT is in use (set KCR_KAFKA_CONTROLLER_PORT)"

# --- fresh config + storage -------------------------------------------------------
keep_data=0
if [[ ${KCR_KAFKA_KEEP_DATA:-0} == 1 && -f $DATA/meta.properties ]]; then
	keep_data=1
	log "reusing the data dir $DATA (KCR_KAFKA_KEEP_DATA=1)"
else
	rm -rf "$DATA"
	mkdir -p "$DATA"
fi
if [[ -n $CLUSTER_NODE ]]; then
	cluster_conf "$CLUSTER_NODE" "$DATA" "$CBASE/tls" >"$CONF"
else
	cat >"$CONF" <<EOF
# Generated by scripts/kafka-up.sh; rewritten on every start.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA

# test friendly: one node (and, unless KCR_KAFKA_PROD=1, no waiting)
num.partitions=3
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
$GROUP_PROPS

# small machine
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
background.threads=4
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=8388608
EOF
fi
if [[ -n ${KCR_KAFKA_SERVER_PROPS:-} ]]; then
	printf '\n# KCR_KAFKA_SERVER_PROPS\n%s\n' "$KCR_KAFKA_SERVER_PROPS" >>"$CONF"
fi

# Random Kafka Uuid (16 bytes, base64url). One starting with '-' would be read as an
# option by the tool (hence also --cluster-id=), so draw again in that case.
if ((!keep_data)); then
	if [[ -n $CLUSTER_NODE ]]; then
		# One cluster id for the three nodes (cluster_up draws it); the
		# quorum is static (controller.quorum.voters); users made now.
		format_args=(--cluster-id="$(cat "$CBASE/cluster.id")"
			--add-scram "SCRAM-SHA-512=[name=$SCRAM_USER,password=$SCRAM_PASSWORD]")
	else
		format_args=(--standalone --cluster-id="$(new_cluster_id)")
	fi
	if ! "$JAVA" "${TOOL_OPTS[@]}" -cp "$CP" kafka.tools.StorageTool format \
		"${format_args[@]}" --config "$CONF" >"$KHOME/format.log" 2>&1 </dev/null; then
		cat "$KHOME/format.log" >&2
		die "kafka-storage format failed (see $KHOME/format.log)"
	fi
fi

# --- start -------------------------------------------------------------------------
# A restart that keeps the data appends to the log: what the broker did
# before it (a group's members, their sessions) explains what follows.
if ((keep_data)); then
	echo "--- kafka-up.sh: restarted $(date -u +%FT%TZ) ---" >>"$LOGFILE"
else
	[[ -f $LOGFILE ]] && mv -f "$LOGFILE" "$LOGFILE.1"
fi
# shellcheck disable=SC2206 # KCR_KAFKA_HEAP_OPTS holds several flags
JVM_OPTS=($HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
	-XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
	"-Dlog4j2.configurationFile=file:$KHOME/log4j2.properties" "-Dkcr.kafka.home=$KHOME")
# The child writes its own pid (setsid may fork); fd 9 (our lock) is not inherited.
# shellcheck disable=SC2016 # $$ is the child's, expanded by the child
setsid bash -c 'echo $$ >"$0"; exec nohup "$@"' "$PIDFILE" \
	"$JAVA" "${JVM_OPTS[@]}" -cp "$CP" kafka.Kafka "$CONF" \
	</dev/null >>"$LOGFILE" 2>&1 9>&- &
for ((i = 0; i < 100; i++)); do
	[[ -s $PIDFILE ]] && break
	sleep 0.05
done
pid=$(cat "$PIDFILE" 2>/dev/null || true)
[[ $pid =~ ^[0-9]+$ ]] || die "broker did not start (no pid in $PIDFILE); see $LOGFILE"

probe_rc=0
info=$(probe "$TIMEOUT" "$pid" 2>"$KHOME/probe.err") || probe_rc=$?
if ((probe_rc != 0)); then
	if ((probe_rc == 3)); then
		log "broker process $pid exited during startup after $(elapsed)"
	else
		log "broker on $BOOTSTRAP not ready after ${TIMEOUT}s: $(tail -n 1 "$KHOME/probe.err" 2>/dev/null)"
	fi
	log "last lines of $LOGFILE:"
	tail -n 40 "$LOGFILE" >&2 || true
	stop_pids "$pid"
	rm -f "$PIDFILE"
	die "Kafka broker failed to start (full log: $LOGFILE)"
fi
echo "kafka: broker $BOOTSTRAP ready (pid $pid, Kafka ${KAFKA_VERSION}, $FLAVOUR, $info) in $(elapsed); log $LOGFILE"
