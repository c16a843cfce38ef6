#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The long soak: tests/progs/sv_soak from the built tree, through our
# library, on a fabric of its own.
#
#   scripts/soak.sh [SECONDS [PROCS [SEED]]]   default 600 s, 4 processes
#
# Environment: SOFTVERBS_BUILD_DIR (default: build), SOFTVERBS_CMA=0 for the
# service-copy path.  Exits non-zero, with the seed to rerun, if any byte or
# counter came out wrong; its fabric's segments are removed either way.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-600}
procs=${2:-4}
seed=${3:-}
build=$(realpath "${SOFTVERBS_BUILD_DIR:-build}")
prog=$build/tests/progs/sv_soak
lib=$build/libibverbs-compat
if [[ ! -x $prog || ! -e $lib/libibverbs.so.1 ]]; then
	echo "soak.sh: $prog or $lib/libibverbs.so.1 missing: build first (ninja -C $build)" >&2
	exit 2
fi

fabric="soak$$"
conf=$(mktemp)
cleanup() {
	rm -f "$conf" "/dev/shm/softverbs-$(id -u)-$fabric" "/dev/shm/softverbs-$(id -u)-$fabric"-*
}
trap cleanup EXIT

args=(-n "$procs" -t "$secs")
[[ -n $seed ]] && args+=(-S "$seed")
# Only our variables: a caller's SOFTVERBS_* must not change the outcome,
# except the copy path, which is the caller's choice.
env -u SOFTVERBS_DEVICES -u SOFTVERBS_DEBUG \
	LD_LIBRARY_PATH="$lib" SOFTVERBS_FABRIC="$fabric" SOFTVERBS_CONFIG="$conf" \
	"$prog" "${args[@]}"
