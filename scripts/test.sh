#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole check: dependencies, a -Werror build, and every meson test suite
# (unit, abi, pyverbs).  Exits non-zero on any failure, and also when no
# test ran at all.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

builddir=${SOFTVERBS_TEST_BUILD_DIR:-build-ci}

ensure_deps
if [[ -f $builddir/build.ninja ]]; then
	meson configure "$builddir" -Dwerror_ci=true -Dtests=true
else
	meson setup "$builddir" -Dwerror_ci=true -Dtests=true
fi
ninja -C "$builddir"

# Logs of an earlier run must not count for this one.
rm -f "$builddir"/meson-logs/testlog.json "$builddir"/meson-logs/testlog.junit.xml \
	"$builddir"/meson-logs/pytest.xml
status=0
meson test -C "$builddir" --print-errorlogs --num-processes 2 || status=$?

# meson's own summary is easy to miss in a long log and counts a test binary
# as one test: summarise the cases inside, and fail if a suite did not run.
summary_status=0
/usr/bin/python3 scripts/test-summary.py "$builddir" unit abi pyverbs rdma-core selftest || summary_status=$?
if [[ $status -ne 0 || $summary_status -ne 0 ]]; then
	exit 1
fi
