# SPDX-License-Identifier: MIT
# Sourced by setup.sh and test.sh: installs the Debian 12 packages that
# softverbs needs to build and test, calling apt-get only when one is missing.

softverbs_packages=(
	meson ninja-build g++ pkg-config
	libibverbs-dev libnl-route-3-dev
	ibverbs-utils perftest rdma-core
	python3-pyverbs python3-pytest python3-pybind11 pybind11-dev
	libgtest-dev ucx-utils python3-matplotlib
	openmpi-bin libopenmpi-dev infiniband-diags
	rdmacm-utils librdmacm-dev qperf fio libfabric-bin
	iproute2 strace
	# tshark: Wireshark's dissector reads the RoCE v2 sample
	# (pyverbs-tests/test_rocev2_wire.py); iperf3: a plain UDP baseline
	# for the rocev2 transport (issue 14).
	tshark iperf3
	python3-dev debhelper dh-python dpkg-dev
)

ensure_deps() {
	local missing=() p
	for p in "${softverbs_packages[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
			missing+=("$p")
		fi
	done
	if [[ ${#missing[@]} -eq 0 ]]; then
		echo "deps: all ${#softverbs_packages[@]} packages present"
		return 0
	fi
	echo "deps: installing ${missing[*]}"
	local sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || {
			echo "deps: missing packages and not root (no sudo): ${missing[*]}" >&2
			return 1
		}
		sudo=(sudo)
	fi
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends "${missing[@]}"
}
