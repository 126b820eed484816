#!/usr/bin/env bash
# Makes runc available for kcr's container tests (test/e2e/container_test.go):
# Debian's runc, without the CRIU it recommends (scripts/install-criu.sh
# provides the CRIU that fits the kernel). Idempotent: does nothing if runc
# is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
if command -v runc >/dev/null 2>&1; then
	exit 0
fi
need_pkg runc runc
runc --version | head -1
