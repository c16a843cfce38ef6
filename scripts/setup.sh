#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what is missing, builds softverbs into ./build, and runs the main
# job: Debian's unmodified ibv_devinfo on the software device loop0.
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
trap '"$builddir/tools/softverbs" clean --force "$fabric" >/dev/null 2>&1 || true' EXIT
"$builddir/tools/softverbs-run" --fabric "$fabric" ibv_devinfo
