#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The polling engine, seen from the kernel: sv_agent_poll poll under
# strace -ff, one trace file per thread.  The agent is the main thread (it
# posts with the inline helpers and polls its CQ ring): its trace must
# hold no shared (non-private) FUTEX_WAKE, the call softverbs_dv_sq_post
# makes when the engine sleeps, while the program's own check passes.
# Usage: agent_poll_strace.sh SV_AGENT_POLL  (env: SOFTVERBS_ENGINE=poll)
set -euo pipefail
prog=$1
command -v strace >/dev/null || { echo "strace missing: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
strace -ff -qq -e trace=futex -o "$dir/t" "$prog" poll | tee "$dir/out"
main=$(sed -n 's/^agent: thread //p' "$dir/out")
[[ -f $dir/t.$main ]] || { echo "no trace of the agent thread '$main'"; exit 1; }
wakes=$(grep -c 'FUTEX_WAKE,' "$dir/t.$main" || true)
echo "agent thread $main: $wakes shared FUTEX_WAKE calls"
[[ $wakes -eq 0 ]] || { grep 'FUTEX_WAKE,' "$dir/t.$main" | head -5; exit 1; }
