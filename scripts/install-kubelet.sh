#!/usr/bin/env bash
# install-kubelet.sh - build the kubelet from the Go module proxy for kcr's
# Kubernetes tests (test/e2e/kubelet_test.go, docs/kubernetes.md).
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod
# replaces its 33 staging modules (k8s.io/api, k8s.io/client-go, ...) with
# directories of its own tree. A throw-away module that requires it and
# replaces each of those with the published v0.MINOR.PATCH builds
# k8s.io/kubernetes/cmd/kubelet as it is released. About 5 minutes on 2
# cores the first time; the binary (~130 MB) is cached by version in
# $KCR_KUBELET_PREFIX/VERSION/kubelet, as the Kafka jars are, and a repeated
# run only checks the stamp.
#
# scripts/kubelet-up.sh runs it standalone against the private containerd.
#
# Prints the kubelet's path.
#
# Environment:
#   KCR_KUBELET_VERSION  Kubernetes version (default v1.37.2)
#   KCR_KUBELET_PREFIX   cache directory (default /var/tmp/kcr-kubelet)
#   KCR_KUBELET_FORCE=1  rebuild
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_go

V=${KCR_KUBELET_VERSION:-v1.37.2}
[[ $V =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "KCR_KUBELET_VERSION '$V' is not a Kubernetes release like v1.37.2"
STAGING=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
PREFIX=${KCR_KUBELET_PREFIX:-/var/tmp/kcr-kubelet}
OUT=$PREFIX/$V
BIN=$OUT/kubelet
STAMP=$OUT/.kcr-kubelet-stamp

if [ "${KCR_KUBELET_FORCE:-0}" != 1 ] && [ -x "$BIN" ] && [ -r "$STAMP" ] && [ "$(cat "$STAMP")" = "$V" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$OUT"
WORK=$(mktemp -d "$PREFIX/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(now_ms)
echo "install-kubelet: building the kubelet $V from the Go module proxy (first run only, minutes)" >&2
(
	cd "$WORK"
	kube_module "$V" "$STAGING"
	printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >tools.go
	go mod tidy >>"$WORK/build.log" 2>&1 || { tail -n 20 "$WORK/build.log" >&2; die "go mod tidy failed for the kubelet $V"; }
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$V" \
		-o "$WORK/kubelet" k8s.io/kubernetes/cmd/kubelet >>"$WORK/build.log" 2>&1 ||
		{ tail -n 20 "$WORK/build.log" >&2; die "go build of the kubelet $V failed"; }
)
"$WORK/kubelet" --version >/dev/null || die "the kubelet built in $WORK does not run"
mv "$WORK/kubelet" "$BIN"
echo "$V" >"$STAMP"
echo "install-kubelet: built $("$BIN" --version) in $(($(now_ms) - t0)) ms: $BIN" >&2
echo "$BIN"
