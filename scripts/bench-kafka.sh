#!/usr/bin/env bash
# Runs the demo (scripts/demo.sh: a Kafka pipeline under load on the
# embedded broker, checkpointed and restored) several times and prints the
# medians: cold start to first acknowledged result against restore to first
# acknowledged result, the checkpoint pause (from the gate closing to the end
# of the dump) and the image size against RSS. With KCR_BENCH_CLIENTS
# (default "kafka-go franz") it runs the pipeline on each client library in
# turn, alternating, and prints one table per library.
#
#   sudo scripts/bench-kafka.sh [runs]    (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_go
need_jq
runs="${1:-5}"
clients="${KCR_BENCH_CLIENTS:-kafka-go franz}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq "$runs"); do
	for c in $clients; do
		KCR_DEMO_CLIENT="$c" KCR_DEMO_RESULT="$dir/$c" scripts/demo.sh >"$dir/demo.log" 2>&1 || {
			tail -n 20 "$dir/demo.log" >&2
			die "demo run $i ($c) failed (its last lines above); run KCR_DEMO_CLIENT=$c scripts/demo.sh to see it all"
		}
	done
done
# col N: the median of column N of the demo's result lines in $out.
col() {
	local v
	mapfile -t v < <(awk -v c="$1" '{print $c}' "$out")
	median "${v[@]}"
}
for c in $clients; do
	out="$dir/$c"
	cold=$(col 1)
	rest=$(col 2)
	pause=$(col 3)
	img=$(col 4)
	rss=$(col 5)
	missing=$(awk '{s+=$6} END{print s}' "$out")
	dups=$(awk '{s+=$7} END{print s}' "$out")
	echo "kcr Kafka pipeline on $c, $runs runs (medians)"
	printf '  %-40s %8.0f ms\n' "cold start to first acked result" "$cold"
	printf '  %-40s %8.0f ms\n' "restore to first acked result" "$rest"
	printf '  %-40s %8.1f x\n' "ratio cold / restore" "$(awk -v a="$cold" -v b="$rest" 'BEGIN{print a/b}')"
	printf '  %-40s %8.1f ms\n' "checkpoint pause (hooks + freeze+dump)" "$(awk -v x="$pause" 'BEGIN{print x/1e6}')"
	printf '  %-40s %8.1f MiB / %.1f MiB (%.2f)\n' "image size / RSS" "$(awk -v x="$img" 'BEGIN{print x/1048576}')" "$(awk -v x="$rss" 'BEGIN{print x/1048576}')" "$(awk -v a="$img" -v b="$rss" 'BEGIN{print a/b}')"
	echo "  records missing (all runs): $missing, duplicates: $dups"
done
