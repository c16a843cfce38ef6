#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# UCX's rendezvous sizes on loop0, many times in a row: the runs that used to
# hang (issue 10: `ucp_am_bw -s 65536` in about half the runs, UCX logging
# "got active message id 0").
#
# usage: scripts/ucx-loop.sh [-b BUILDDIR] [-n ROUNDS] [-t SECONDS]
#   -b  build directory whose tools/softverbs-run is used (default build)
#   -n  rounds (default 20); each round runs ucp_am_bw, tag_bw, ucp_put_bw
#       and ucp_get at 64 KiB and 1 MiB, once with cross-memory attach and
#       once with SOFTVERBS_CMA=0 (the service copy path)
#   -t  timeout per run in seconds (default 60); a run past it counts as hung
#
# Each run is an ucx_perftest server and client (TCP on localhost for the
# setup, UCX_TLS=rc_verbs,ud_verbs,self and UCX_NET_DEVICES=loop0:1 for the
# traffic) on a fabric of its own.  ucx_perftest checks no data: what this
# counts is completion, exit status and UCX error lines.  Prints one line per
# failed or hung run (with its log directory) and a count per test; exits 1
# if any run did not complete cleanly.
#
# UCX needs /dev/infiniband/uverbs0 to keep the device: softverbs-run
# presents it where its view is built in; elsewhere run this where such a
# node exists.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build
rounds=20
limit=60
while getopts "b:n:t:h" opt; do
	case $opt in
	b) build=$OPTARG ;;
	n) rounds=$OPTARG ;;
	t) limit=$OPTARG ;;
	*)
		sed -n '3,23p' "$0" | sed 's/^# \{0,1\}//'
		exit 2
		;;
	esac
done
run=$build/tools/softverbs-run
[[ -x $run ]] || { echo "ucx-loop: $run not found (build first)" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx-loop: ucx_perftest not installed (ucx-utils)" >&2; exit 2; }

logs=$(mktemp -d /tmp/ucx-loop.XXXXXX)
export UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=loop0:1

# True once something listens on TCP port $1 (the server is ready for the
# client; connecting to find out would be taken as the client).
listening() {
	awk -v p="$(printf '%04X' "$1")" \
		'{ n = split($2, a, ":"); if (a[n] == p && $4 == "0A") f = 1 } END { exit !f }' \
		/proc/net/tcp /proc/net/tcp6 2>/dev/null
}

free_port() {
	/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

declare -A ok bad
total_bad=0
seq_no=0
one() { # NAME CMA TEST SIZE ITERS
	local name=$1 cma=$2 test=$3 size=$4 iters=$5 port dir srv cli rs rc i
	port=$(free_port)
	dir=$logs/$name
	mkdir -p "$dir"
	seq_no=$((seq_no + 1))
	# Fabric names are at most 32 characters.
	export SOFTVERBS_FABRIC=ucxloop-$$-$seq_no SOFTVERBS_CMA=$cma
	timeout -k 5 "$limit" "$run" ucx_perftest -p "$port" -t "$test" -s "$size" \
		-n "$iters" -w 10 >"$dir/server.log" 2>&1 &
	srv=$!
	for ((i = 0; i < 100; i++)); do
		listening "$port" && break
		kill -0 "$srv" 2>/dev/null || break
		sleep 0.05
	done
	timeout -k 5 "$limit" "$run" ucx_perftest -p "$port" -t "$test" -s "$size" \
		-n "$iters" -w 10 localhost >"$dir/client.log" 2>&1
	rc=$?
	wait "$srv"
	rs=$?
	"$build/tools/softverbs" clean --force "$SOFTVERBS_FABRIC" >/dev/null 2>&1
	local key="$test/$size/cma=$cma"
	if ((rc == 0 && rs == 0)) && grep -q '^Final:' "$dir/client.log" &&
		! grep -qE 'UCX +(ERROR|FATAL)|got active message id' "$dir"/*.log; then
		ok[$key]=$((${ok[$key]:-0} + 1))
		rm -rf "$dir"
	else
		bad[$key]=$((${bad[$key]:-0} + 1))
		total_bad=$((total_bad + 1))
		local why="exit client=$rc server=$rs"
		((rc == 124 || rs == 124)) && why="HUNG ($limit s): $why"
		echo "FAIL $key: $why; logs in $dir"
	fi
}

for ((r = 1; r <= rounds; r++)); do
	for cma in 1 0; do
		for test in ucp_am_bw tag_bw ucp_put_bw ucp_get; do
			one "r$r-$cma-$test-64k" "$cma" "$test" 65536 1000
			one "r$r-$cma-$test-1m" "$cma" "$test" 1048576 100
		done
	done
done

echo "rounds: $rounds, timeout per run: $limit s"
for cma in 1 0; do
	for test in ucp_am_bw tag_bw ucp_put_bw ucp_get; do
		for size in 65536 1048576; do
			key="$test/$size/cma=$cma"
			printf '%-28s completed %3d  failed or hung %3d\n' "$key" "${ok[$key]:-0}" "${bad[$key]:-0}"
		done
	done
done
if ((total_bad)); then
	echo "ucx-loop: $total_bad run(s) failed or hung (logs in $logs)"
	exit 1
fi
rmdir "$logs" 2>/dev/null
echo "ucx-loop: all $((rounds * 16)) runs completed"
