#!/bin/bash
# Checks that our librdmacm.so.1 is a drop-in for rdma-core 44's (the
# checks of check_abi.sh, for the connection manager).
#
# usage: check_rdmacm_abi.sh path/to/our/librdmacm.so.1 [system librdmacm.so.1]
#
# (a) Every symbol version the system library exports (default @@ or hidden
#     @, with its function/object type) is exported by ours, the version
#     nodes inherit as they do there, and the SONAME matches. Extra exports
#     are reported, not failed.
# (b) Debian's unmodified consumers (rdmacm-utils, perftest, qperf,
#     libfabric, librspreload, pyverbs' rdma_cm modules) resolve
#     librdmacm.so.1 (and libibverbs.so.1) to ours under `ldd -r` and bind
#     every symbol. Each object is first checked
#     against the system library, so only problems that ours introduces
#     count (pyverbs modules, for one, leave Python symbols to the
#     interpreter).
#
# Exit status: 0 pass, 1 fail, 77 (meson's "skip") when the system library
# or the tools to compare with are missing.

set -u
export LC_ALL=C

ours=${1:?usage: check_rdmacm_abi.sh path/to/librdmacm.so.1 [system librdmacm.so.1]}
system=${2:-/usr/lib/x86_64-linux-gnu/librdmacm.so.1}
libdir=/usr/lib/x86_64-linux-gnu

for tool in objdump ldd awk comm; do
	if ! command -v "$tool" >/dev/null; then
		echo "SKIP: $tool not found"
		exit 77
	fi
done
if [[ ! -e $system ]]; then
	echo "SKIP: no system library at $system to compare with"
	exit 77
fi
if [[ ! -f $ours ]]; then
	echo "FAIL: $ours does not exist"
	exit 1
fi
ours=$(readlink -f "$ours")
ourdir=$(dirname "$ours")
system=$(readlink -f "$system")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# Defined, versioned exports as "name@@VERSION TYPE" (default) or
# "name@VERSION TYPE" (hidden), TYPE being F(unction), O(bject) or -.
# objdump -T prints fixed columns: 7 flag characters at 18..24, the last
# being the type; hidden versions are printed in parentheses.
exports() {
	objdump -T "$1" | awk '
		$0 !~ /^[0-9a-f]+ / { next }
		index($0, "*UND*") { next }
		{
			flags = substr($0, 18, 7)
			if (substr(flags, 1, 1) == "l") next
			type = substr(flags, 7, 1)
			if (type != "F" && type != "O") type = "-"
			ver = $(NF - 1); name = $NF
			if (ver ~ /^\(.*\)$/)
				print name "@" substr(ver, 2, length(ver) - 2), type
			else
				print name "@@" ver, type
		}' | sort -u
}

# Version definitions with their parents, "NODE<parent" per line.
verdefs() {
	objdump -p "$1" | awk '
		/^Version definitions:/ { on = 1; next }
		on && /^$/ { exit }
		on && /^[0-9]+ / { if (node != "") print node "<" parent
				   node = $4; parent = ""; next }
		on { parent = parent $1 }
		END { if (node != "") print node "<" parent }' | sort
}

soname() {
	objdump -p "$1" | awk '$1 == "SONAME" { print $2 }'
}

echo "== (a) exported symbol versions: $ours"
echo "   against $system"

exports "$system" | grep 'RDMACM' >"$tmp/sys"
exports "$ours" >"$tmp/ours"
cut -d' ' -f1 "$tmp/sys" | sort >"$tmp/sys.names"
cut -d' ' -f1 "$tmp/ours" | sort >"$tmp/ours.names"

total=$(wc -l <"$tmp/sys.names")
comm -23 "$tmp/sys.names" "$tmp/ours.names" >"$tmp/missing"
present=$((total - $(wc -l <"$tmp/missing")))
echo "$present of $total symbol versions present"
if [[ -s $tmp/missing ]]; then
	failed=1
	echo "FAIL: missing from ours (@@ default, @ hidden compat):"
	sed 's/^/  /' "$tmp/missing"
fi

# Same symbol version, different kind (a function where a variable belongs).
join "$tmp/sys" "$tmp/ours" | awk '$2 != $3' >"$tmp/kind"
if [[ -s $tmp/kind ]]; then
	failed=1
	echo "FAIL: symbol type differs (name, system type, our type):"
	sed 's/^/  /' "$tmp/kind"
fi

comm -13 "$tmp/sys.names" "$tmp/ours.names" >"$tmp/extra"
if [[ -s $tmp/extra ]]; then
	echo "note: $(wc -l <"$tmp/extra") exported by ours but not by the system library:"
	sed 's/^/  /' "$tmp/extra"
fi

verdefs "$system" >"$tmp/sys.verdefs"
# Our own extension nodes (SOFTVERBS_*) would come on top of rdma-core's
# and are not compared (librdmacm has none).
verdefs "$ours" | grep -v '^SOFTVERBS_' >"$tmp/ours.verdefs" || true
if ! diff -u "$tmp/sys.verdefs" "$tmp/ours.verdefs" >"$tmp/verdefs.diff"; then
	failed=1
	echo "FAIL: version nodes or their inheritance differ (NODE<parent):"
	sed 's/^/  /' "$tmp/verdefs.diff"
fi

if [[ $(soname "$ours") != "$(soname "$system")" ]]; then
	failed=1
	echo "FAIL: SONAME is '$(soname "$ours")', expected '$(soname "$system")'"
fi

echo
echo "== (b) ldd -r of unmodified consumers with LD_LIBRARY_PATH=$ourdir"

consumers=()
for b in rping ucmatose udaddy mckey cmtime rdma_client rdma_server \
	rdma_xclient rdma_xserver riostream rstream rcopy udpong; do
	consumers+=("/usr/bin/$b")
done
for f in /usr/bin/ib_*_bw /usr/bin/ib_*_lat /usr/bin/qperf \
	/usr/lib/python3/dist-packages/pyverbs/cmid*.so \
	"$libdir"/libfabric.so.1 "$libdir"/rsocket/librspreload.so.1; do
	[[ -e $f ]] && consumers+=("$f")
done

# Lines of `ldd -r` that mean a broken binding.
problems() {
	grep -E 'undefined symbol|version .* not found|not found' "$1" |
		sed -E 's/\(0x[0-9a-f]+\)//; s/[[:space:]]+/ /g' | sort -u
}

checked=0
bad=0
skipped=0
for f in "${consumers[@]}"; do
	if [[ ! -e $f ]]; then
		echo "  skip  $f (not installed)"
		skipped=$((skipped + 1))
		continue
	fi
	checked=$((checked + 1))
	env -u LD_LIBRARY_PATH ldd -r "$f" >"$tmp/base" 2>&1
	LD_LIBRARY_PATH=$ourdir ldd -r "$f" >"$tmp/with" 2>&1

	msgs=()
	resolved=$(awk '$1 == "librdmacm.so.1" && $2 == "=>" { print $3 }' "$tmp/with")
	verbs=$(awk '$1 == "libibverbs.so.1" && $2 == "=>" { print $3 }' "$tmp/with")
	if [[ $(readlink -f "$f") == "$system" ]]; then
		:
	elif [[ -z $resolved ]]; then
		# Does not link librdmacm at all: nothing of ours to check.
		if grep -q 'librdmacm.so.1' "$tmp/base"; then
			msgs+=("librdmacm.so.1 not resolved")
		fi
	elif [[ $(readlink -f "$resolved") != "$ours" ]]; then
		msgs+=("librdmacm.so.1 resolves to $resolved, not ours")
	fi
	if [[ -n $verbs && $(dirname "$(readlink -f "$verbs")") != "$ourdir" ]]; then
		msgs+=("libibverbs.so.1 resolves to $verbs, not to the one beside ours")
	fi

	problems "$tmp/base" >"$tmp/base.p"
	problems "$tmp/with" >"$tmp/with.p"
	while IFS= read -r line; do
		msgs+=("$line")
	done < <(comm -13 "$tmp/base.p" "$tmp/with.p")

	if ((${#msgs[@]})); then
		bad=$((bad + 1))
		echo "  FAIL  $f"
		printf '          %s\n' "${msgs[@]}"
	else
		echo "  ok    $f"
	fi
done

if ((bad)); then
	failed=1
fi

echo
echo "== summary"
echo "symbols:   $present of $total symbol versions present" \
	"($(wc -l <"$tmp/extra") extra)"
echo "consumers: $((checked - bad)) of $checked bind to ours cleanly" \
	"($skipped not installed)"
if ((failed)); then
	echo "RESULT: FAIL"
	exit 1
fi
echo "RESULT: PASS"
exit 0
