#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs one agent test on a fabric of its own: SOFTVERBS_FABRIC gets this
# run's pid appended, so that neither a concurrent run (another build
# directory) nor a fabric an older build left in /dev/shm (another ABI
# version, refused) can touch it, and the fabric is removed afterwards,
# whatever the test's status.
# Usage: on_fabric.sh SOFTVERBS_TOOL PROGRAM [ARG...]
set -uo pipefail
tool=$1
shift
export SOFTVERBS_FABRIC="${SOFTVERBS_FABRIC:-agent}-$$"
"$@"
status=$?
"$tool" clean --force "$SOFTVERBS_FABRIC" >/dev/null 2>&1 || true
exit $status
