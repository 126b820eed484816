#!/usr/bin/env bash
# Plain vs lazy (userfaultfd) restore, as root:
#
#   sudo scripts/bench-lazy.sh [sizes-in-MiB] [runs]      # default: 64,256,1024 5
#
# For each heap size it starts test/apps/lazyheap detached (setsid,
# stdin /dev/null, output appended to a file, GODEBUG=multipathtcp=0): a
# service whose heap is filled with a per-page pattern and which answers
# "ping" (touches little memory) and "sum" (checksums the whole heap and
# checks every page). It dumps it (killing it) and then restores it, `runs`
# times each, alternating plain restore (package criu, i.e. criu swrk
# restore) and lazy restore (criu lazy-pages daemon + restore with
# lazy_pages), and prints medians of the time until the restore returns,
# until the first ping answers and until a full-heap checksum answers, with
# lazy/plain ratios and the image size. Images go under /var/tmp (override
# with KCR_BENCH_DIR) and are deleted, like every process started here.
#
# Images stay in the page cache between the dump and the restores (warm
# cache): that is what a restore on the machine that just dumped sees.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

sizes="${1:-64,256,1024}"
runs="${2:-5}"
dir="${KCR_BENCH_DIR:-/var/tmp}"

need_root
need_go

root=$(mktemp -d "$dir/kcr-bench-lazy.XXXXXX")
bin="$root/bin"
driver=
cleanup() {
	# lazybench reaps what it started and deletes its images itself; this
	# is for an interrupted run. Only processes of this run: their command
	# lines hold $root.
	if [ -n "$driver" ]; then
		kill -TERM "$driver" 2>/dev/null || true
		wait "$driver" 2>/dev/null || true
	fi
	local p
	for p in $(pgrep -f "$root/" || true); do
		kill -9 "$p" 2>/dev/null || true
	done
	rm -rf "$root"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$bin"
go build -o "$bin/lazyheap" ./test/apps/lazyheap
go build -o "$bin/lazybench" ./test/apps/lazybench
"$bin/lazybench" bench -heap "$bin/lazyheap" -mb "$sizes" -runs "$runs" -dir "$root" &
driver=$!
wait "$driver"
driver=
