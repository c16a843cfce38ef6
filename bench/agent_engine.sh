#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cost of the agents' engine thread in each mode (docs/agent.md, "The
# polling engine"): runs `sv_agent_poll bench` RUNS times (default 3) in
# futex and poll mode, free to use every core and pinned to one core
# (taskset -c 0, so that the engine, the agent and the peer share it).
# Usage: bench/agent_engine.sh [BUILD_DIR] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-3}
prog=$build/tests/agent/sv_agent_poll
[[ -x $prog ]] || { echo "no $prog: build with -Dtests=true" >&2; exit 1; }
command -v taskset >/dev/null || { echo "taskset (util-linux) is needed" >&2; exit 1; }
for ((r = 1; r <= runs; r++)); do
	for pin in "" "taskset -c 0"; do
		for mode in futex poll; do
			echo "== run $r, $mode, ${pin:-unpinned}"
			# A fabric of its own per run, removed afterwards.
			fabric=agent-engine-$$-$r-$mode
			SOFTVERBS_FABRIC=$fabric SOFTVERBS_ENGINE=$mode timeout 300 $pin "$prog" bench |
				grep -v '^engine mode'
			"$build/tools/softverbs" clean --force "$fabric" >/dev/null 2>&1 || true
		done
	done
done
