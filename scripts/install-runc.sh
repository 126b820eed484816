#!/usr/bin/env bash
# Makes runc available for kcr's container tests (test/e2e/container_test.go):
# Debian's runc, without the CRIU it recommends (scripts/install-criu.sh
# provides the CRIU that fits the kernel). Idempotent: does nothing if runc
# is on PATH.
set -euo pipefail
if command -v runc >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "scripts/install-runc.sh: run as root (sudo scripts/install-runc.sh)" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "scripts/install-runc.sh: no apt-get: install runc (>= 1.1) with your package manager" >&2
	exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc >/dev/null
runc --version | head -1
