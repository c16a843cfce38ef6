#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a command on a fabric of its own (SOFTVERBS_FABRIC=<prefix>-<pid>)
# and removes that fabric's segments afterwards, whatever the command did.
# usage: isolated.sh PREFIX COMMAND [ARGS...]
set -u
prefix=$1
shift
export SOFTVERBS_FABRIC="$prefix-$$"
cleanup() {
	rm -f "/dev/shm/softverbs-$(id -u)-$SOFTVERBS_FABRIC" \
		"/dev/shm/softverbs-$(id -u)-$SOFTVERBS_FABRIC"-q*
}
trap cleanup EXIT
"$@"
