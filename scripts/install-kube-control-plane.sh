#!/usr/bin/env bash
# install-kube-control-plane.sh - build a Kubernetes control plane from the
# Go module proxy for kcr's cluster tests (test/e2e/kube_cluster_test.go,
# docs/kubernetes.md): kube-apiserver, kube-controller-manager and
# kube-scheduler of k8s.io/kubernetes, and etcd (go.etcd.io/etcd/server/v3,
# whose module root is etcd's main package) at the version kubernetes
# requires.
#
# As for install-kubelet.sh: a throw-away module requires k8s.io/kubernetes
# and replaces each of its staging modules with the published
# v0.MINOR.PATCH; one go build makes the four binaries. They are cached by
# version in $KCR_KUBE_PREFIX/VERSION/ and a repeated run only checks the
# stamp.
#
# scripts/kube-up.sh runs them on loopback.
#
# Prints the directory of the binaries.
#
# Environment:
#   KCR_KUBE_VERSION  Kubernetes version (default v1.37.2)
#   KCR_KUBE_PREFIX   cache directory (default /var/tmp/kcr-kube)
#   KCR_KUBE_FORCE=1  rebuild
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_go

V=${KCR_KUBE_VERSION:-v1.37.2}
[[ $V =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "KCR_KUBE_VERSION '$V' is not a Kubernetes release like v1.37.2"
STAGING=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
PREFIX=${KCR_KUBE_PREFIX:-/var/tmp/kcr-kube}
OUT=$PREFIX/$V
STAMP=$OUT/.kcr-kube-stamp
BINS="etcd kube-apiserver kube-controller-manager kube-scheduler"

ok=1
for b in $BINS; do [ -x "$OUT/$b" ] || ok=0; done
if [ "${KCR_KUBE_FORCE:-0}" != 1 ] && ((ok)) && [ -r "$STAMP" ] && [ "$(cat "$STAMP")" = "$V" ]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$OUT"
WORK=$(mktemp -d "$PREFIX/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(now_ms)
echo "install-kube-control-plane: building etcd and the control plane $V from the Go module proxy (first run only, minutes)" >&2
(
	cd "$WORK"
	kube_module "$V" "$STAGING"
	cat >tools.go <<-'EOF'
		package tools

		import (
			_ "go.etcd.io/etcd/server/v3"
			_ "k8s.io/kubernetes/cmd/kube-apiserver"
			_ "k8s.io/kubernetes/cmd/kube-controller-manager"
			_ "k8s.io/kubernetes/cmd/kube-scheduler"
		)
	EOF
	go mod tidy >>"$WORK/build.log" 2>&1 || { tail -n 20 "$WORK/build.log" >&2; die "go mod tidy failed for the control plane $V"; }
	mkdir bin
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$V" -o bin/ \
		go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler >>"$WORK/build.log" 2>&1 ||
		{ tail -n 20 "$WORK/build.log" >&2; die "go build of the control plane $V failed"; }
	# etcd's package is its module root: go build names it after the path
	# element before the major version.
	mv bin/server bin/etcd
)
for b in $BINS; do
	"$WORK/bin/$b" --version >/dev/null 2>&1 || die "$b built in $WORK does not run"
done
for b in $BINS; do mv "$WORK/bin/$b" "$OUT/$b"; done
echo "$V" >"$STAMP"
echo "install-kube-control-plane: built $BINS $V in $(($(now_ms) - t0)) ms: $OUT" >&2
echo "$OUT"
