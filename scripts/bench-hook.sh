#!/usr/bin/env bash
# What kcr's CRIU action script costs at pre-dump, while CRIU waits before it
# freezes the tree, piece by piece and side by side for two builds: BASE (a
# git revision, default main) and this worktree. The same service
# (test/e2e/kafkaapp with a kcr socket, producing to an embedded kfake
# broker) runs on the host; the script is called as CRIU calls it, with
# CRTOOLS_SCRIPT_ACTION and CRTOOLS_INIT_PID, but without CRIU (the resume
# watcher finds its "CRIU" gone and resumes the app). Rounds alternate the
# variants. Prints medians.
#
#   scripts/bench-hook.sh [ROUNDS] [BASE]     # default 21 main
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-21}
base=${2:-main}
port=${KCR_BENCH_PORT:-19493}
command -v python3 >/dev/null || { echo "bench-hook.sh: needs python3" >&2; exit 1; }

work=$(mktemp -d /tmp/kcr-bench-hook-XXXXXX)
cleanup() {
	[ -n "${app:-}" ] && kill "$app" 2>/dev/null || true
	[ -n "${broker:-}" ] && kill "$broker" 2>/dev/null || true
	[ -n "${KCR_BENCH_KEEP:-}" ] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
mkdir -p "$work/base/src" "$work/head"
git archive "$base" | tar -x -C "$work/base/src"
(cd "$work/base/src" && go build -o "$work/base/kcr" ./cmd/kcr &&
	{ [ ! -d cmd/kcr-hook ] || CGO_ENABLED=0 go build -o "$work/base/kcr-hook" ./cmd/kcr-hook; })
go build -o "$work/head/kcr" ./cmd/kcr
CGO_ENABLED=0 go build -o "$work/head/kcr-hook" ./cmd/kcr-hook
go build -o "$work/broker" ./examples/broker
go build -o "$work/kafkaapp" ./test/e2e/kafkaapp
for b in base head; do
	"$work/$b/kcr" install-runtime-hook --config "$work/$b.conf" --hook "$work/$b/kcr-criu-hook" >/dev/null 2>&1
done

"$work/broker" -addr "127.0.0.1:$port" -topics bench:1 >"$work/broker.log" 2>&1 &
broker=$!
sleep 0.5
mkdir -p "$work/sock"
KCR_SOCKET_DIR="$work/sock" GODEBUG=multipathtcp=0 setsid "$work/kafkaapp" -brokers "127.0.0.1:$port" -topic bench -produce-rate 200 </dev/null >"$work/app.log" 2>&1 &
app=$!
for _ in $(seq 50); do [ -S "$work/sock/kcr-$app.sock" ] && break; sleep 0.1; done
sleep 1

python3 - "$work" "$app" "$rounds" "$base" <<'PY'
import os, re, statistics, subprocess, sys, time
work, app, rounds, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sleeper = subprocess.Popen(["sleep", "3600"])
def env(action, init):
    return dict(os.environ, CRTOOLS_SCRIPT_ACTION=action, CRTOOLS_INIT_PID=str(init), KCR_HOOK_STATE_DIR=work + "/state")
def script(b): return f"{work}/{b}/kcr-criu-hook"
def prog(b):  # what the script starts at pre-dump, exiting at once
    run = open(script(b)).read().split("pre-dump|post-resume) exec ")[1].split(" ;;")[0]
    argv = [a.strip("'") for a in run.split()]
    return (argv + ["version"]) if argv[-1] == "criu-hook" else argv
builds = {base: "base", "this tree": "head"}
variants = {"spawn /bin/true": (["/bin/true"], None), "sh -c :": (["/bin/sh", "-c", ":"], None),
            "sh wrapper (sh -c 'true; :')": (["/bin/sh", "-c", "/bin/true; :"], None)}
for name, b in builds.items():
    variants[f"{name}: script at a no-op stage"] = ([script(b)], env("post-dump", app))
    variants[f"{name}: Go start of {os.path.basename(prog(b)[0])}"] = (prog(b), {})
    variants[f"{name}: pre-dump, no socket in the tree"] = ([script(b)], env("pre-dump", sleeper.pid))
    # In a sh that exits after it, so that the watcher finds its parent gone.
    variants[f"{name}: pre-dump with the app (in sh)"] = (["/bin/sh", "-c", script(b) + "; :"], env("pre-dump", app))
res = {k: [] for k in variants}
hooks = {n: [] for n in builds}
for _ in range(rounds):
    for k, (argv, e) in variants.items():
        with open(work + "/err.log", "w+") as ef:  # a file, as CRIU's log: the watcher keeps it open
            t = time.perf_counter_ns()
            p = subprocess.run(argv, env=e, stdout=subprocess.DEVNULL, stderr=ef)
            d = (time.perf_counter_ns() - t) / 1e6
            ef.seek(0); err = ef.read()
        if p.returncode != 0 and "Go start" not in k:
            sys.exit(f"{k}: exit {p.returncode}: {err[-400:]}")
        res[k].append(d)
        if k.endswith("(in sh)"):
            m = re.search(r"hooks done.*took=([0-9.]+)(ms|µs)", err)
            hooks[k.split(":")[0]].append(float(m.group(1)) * (1 if m.group(2) == "ms" else 0.001))
            time.sleep(0.3)  # the watcher resumes the app
sleeper.kill()
med = {k: statistics.median(v) for k, v in res.items()}
print(f"{rounds} rounds; medians in ms (each as spawned by python: 'spawn /bin/true' is that cost)")
for k, v in med.items():
    print(f"  {k:52} {v:7.2f}")
sh = med["sh wrapper (sh -c 'true; :')"]
out = {}
for n in builds:
    total = med[f"{n}: pre-dump with the app (in sh)"] - sh + med["spawn /bin/true"]
    h = statistics.median(hooks[n])
    out[n] = total - h
    print(f"{n:>10}: pre-dump with the app {total:6.2f}, of which the app's hooks {h:5.2f}: the script adds {total - h:6.2f}")
b, h = out[base], out["this tree"]
print(f"added by the script: {b:.2f} -> {h:.2f} ms ({h - b:+.2f} ms, {h / b:.2f}x)")
PY
