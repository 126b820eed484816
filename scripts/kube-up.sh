#!/usr/bin/env bash
# kube-up.sh - run the control plane of install-kube-control-plane.sh on
# loopback for kcr's cluster tests: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, unless they already run.
# scripts/kubelet-up.sh with KCR_KUBELET_KUBECONFIG=HOME/kubelet.kubeconfig
# registers the kubelet as the node kcr-node. scripts/kube-down.sh stops
# them and removes the home.
#
# Everything lives in the home (0700; keys 0600): a CA made at each start,
# the API server's serving certificate (127.0.0.1), client certificates
# for etcd (TLS both ways, client certificates required), the admin
# (system:masters, also used by the controller manager and the scheduler)
# and the kubelet (system:node:kcr-node, for the Node authorizer), the
# service-account signing key, etcd's data, kubeconfigs, logs, and
# volumes/, the directory the tests' PersistentVolumes (hostPath) live in.
#
# The cluster has no CNI: pods run on the host network (the tests' brokers
# are on loopback) and containerd reports its network not ready, so the
# node stays NotReady; neither the admission plugin that taints a new node
# not-ready (TaintNodesByCondition) nor the node lifecycle controller,
# which would taint it for that and evict its pods, is on. Nothing listens beyond 127.0.0.1: the controller
# manager's and the scheduler's own HTTPS servers are off.
#
# Prints the admin kubeconfig.
#
# Environment:
#   KCR_KUBE_HOME            its files (default /var/tmp/kcr-kube-run)
#   KCR_KUBE_APISERVER_PORT  the API server's port (default 16443)
#   KCR_KUBE_ETCD_PORT       etcd's client port (default 16379); its peer
#                            port is the next one
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_pkg openssl openssl

HOME_=${KCR_KUBE_HOME:-/var/tmp/kcr-kube-run}
APIPORT=${KCR_KUBE_APISERVER_PORT:-16443}
ETCDPORT=${KCR_KUBE_ETCD_PORT:-16379}
PEERPORT=$((ETCDPORT + 1))
BIN=$(scripts/install-kube-control-plane.sh)
PKI=$HOME_/pki
ADMIN=$HOME_/admin.kubeconfig
CURL=(curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")

running() {
	local c
	for c in etcd kube-apiserver kube-controller-manager kube-scheduler; do
		[ -r "$HOME_/$c.pid" ] && alive "$(cat "$HOME_/$c.pid")" || return 1
	done
}
if running && "${CURL[@]}" "https://127.0.0.1:$APIPORT/readyz" >/dev/null 2>&1; then
	echo "$ADMIN"
	exit 0
fi
[ ! -e "$HOME_" ] || die "$HOME_ exists but its control plane does not run: scripts/kube-down.sh first"
mkdir -p "$HOME_"
chmod 0700 "$HOME_"
mkdir -m 0700 "$PKI" "$HOME_/etcd" "$HOME_/volumes"
umask 077

# cert NAME SUBJECT [SAN]: a key and a certificate signed by the CA.
cert() {
	openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr" 2>/dev/null
	local ext=$PKI/$1.ext
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[ -z "${3:-}" ] || echo "subjectAltName=$3"
	} >"$ext"
	openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 30 -sha256 -extfile "$ext" -out "$PKI/$1.crt" 2>/dev/null
	rm -f "$PKI/$1.csr" "$ext"
}
openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -subj "/CN=kcr-kube-ca" \
	-days 30 -sha256 -out "$PKI/ca.crt" 2>/dev/null
SAN="IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
cert etcd "/CN=kcr-etcd" "IP:127.0.0.1,DNS:localhost"
cert apiserver "/CN=kube-apiserver" "$SAN"
cert admin "/O=system:masters/CN=kcr-admin"
cert kubelet "/O=system:nodes/CN=system:node:kcr-node"
openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null

# kubeconfig FILE USER: a kubeconfig of the API server with USER's certificate.
kubeconfig() {
	cat >"$1" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: kcr
		  cluster:
		    server: https://127.0.0.1:$APIPORT
		    certificate-authority: $PKI/ca.crt
		users:
		- name: $2
		  user:
		    client-certificate: $PKI/$2.crt
		    client-key: $PKI/$2.key
		contexts:
		- name: kcr
		  context: {cluster: kcr, user: $2}
		current-context: kcr
	EOF
}
kubeconfig "$ADMIN" admin
kubeconfig "$HOME_/kubelet.kubeconfig" kubelet

# start NAME ARGS...: run a component in its own session, its log in the home.
start() {
	local n=$1
	shift
	setsid "$BIN/$n" "$@" </dev/null >>"$HOME_/$n.log" 2>&1 &
	echo $! >"$HOME_/$n.pid"
}
# wait_for NAME WHAT CMD...: poll CMD for 120 s while NAME runs.
wait_for() {
	local n=$1 what=$2
	shift 2
	for _ in $(seq 1 600); do
		"$@" >/dev/null 2>&1 && return 0
		alive "$(cat "$HOME_/$n.pid")" || { tail -n 20 "$HOME_/$n.log" >&2; die "$n exited; log $HOME_/$n.log"; }
		sleep 0.2
	done
	tail -n 20 "$HOME_/$n.log" >&2
	die "$n: $what within 120 s; log $HOME_/$n.log"
}

start etcd --name kcr --data-dir "$HOME_/etcd" \
	--listen-client-urls "https://127.0.0.1:$ETCDPORT" --advertise-client-urls "https://127.0.0.1:$ETCDPORT" \
	--listen-peer-urls "https://127.0.0.1:$PEERPORT" --initial-advertise-peer-urls "https://127.0.0.1:$PEERPORT" \
	--initial-cluster "kcr=https://127.0.0.1:$PEERPORT" --listen-metrics-urls "" \
	--cert-file "$PKI/etcd.crt" --key-file "$PKI/etcd.key" --trusted-ca-file "$PKI/ca.crt" --client-cert-auth \
	--peer-cert-file "$PKI/etcd.crt" --peer-key-file "$PKI/etcd.key" --peer-trusted-ca-file "$PKI/ca.crt" --peer-client-cert-auth \
	--log-level warn
wait_for etcd "no answer on 127.0.0.1:$ETCDPORT" \
	curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$ETCDPORT/health"

start kube-apiserver --bind-address 127.0.0.1 --secure-port "$APIPORT" --advertise-address 127.0.0.1 \
	--etcd-servers "https://127.0.0.1:$ETCDPORT" --etcd-cafile "$PKI/ca.crt" \
	--etcd-certfile "$PKI/admin.crt" --etcd-keyfile "$PKI/admin.key" \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
	--kubelet-client-certificate "$PKI/admin.crt" --kubelet-client-key "$PKI/admin.key" \
	--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
	--service-account-signing-key-file "$PKI/sa.key" --service-cluster-ip-range 10.0.0.0/24 \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
	--disable-admission-plugins TaintNodesByCondition \
	--endpoint-reconciler-type none --allow-privileged
wait_for kube-apiserver "not ready on 127.0.0.1:$APIPORT" "${CURL[@]}" "https://127.0.0.1:$APIPORT/readyz"

start kube-controller-manager --kubeconfig "$ADMIN" --secure-port 0 --leader-elect=false \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--controllers '*,-node-lifecycle-controller' --use-service-account-credentials=false
start kube-scheduler --kubeconfig "$ADMIN" --secure-port 0 --leader-elect=false
# The controller manager is up when the default namespace has its service
# account (its token controller and service-account controller run).
wait_for kube-controller-manager "no default service account" \
	"${CURL[@]}" "https://127.0.0.1:$APIPORT/api/v1/namespaces/default/serviceaccounts/default"
running || die "a component of the control plane exited; logs in $HOME_"
echo "$ADMIN"
