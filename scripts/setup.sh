#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what is missing, builds softverbs into ./build, and runs the main
# job: Debian's unmodified ibv_devinfo on the software device loop0, then an
# ibv_rc_pingpong pair between two processes through it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

builddir=${SOFTVERBS_BUILD_DIR:-build}

ensure_deps
if [[ ! -f $builddir/build.ninja ]]; then
	meson setup "$builddir"
fi
ninja -C "$builddir"

echo "== main job: ibv_devinfo through softverbs-run"
# A fabric of its own, removed afterwards, so that reruns start clean.
fabric=setup-$$
server_pid=
cleanup() {
	[[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null
	"$builddir/tools/softverbs" clean --force "$fabric" >/dev/null 2>&1 || true
}
trap cleanup EXIT
run=("$builddir/tools/softverbs-run" --fabric "$fabric")
"${run[@]}" ibv_devinfo

echo "== main job: ibv_rc_pingpong server and client, two processes on loop0"
# A free TCP port for the pingpong's connection exchange.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 60 "${run[@]}" ibv_rc_pingpong -p "$port" -n 10000 -s 4096 -c &
server_pid=$!
client_ok=0
for _ in $(seq 50); do
	sleep 0.2
	if timeout 60 "${run[@]}" ibv_rc_pingpong -p "$port" -n 10000 -s 4096 -c localhost; then
		client_ok=1
		break
	fi
done
wait "$server_pid"
server_pid=
[[ $client_ok -eq 1 ]] || { echo "main job: ibv_rc_pingpong client failed" >&2; exit 1; }
echo "== main job: done"
