#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the Debian packages from an export of the source tree (tracked and
# untracked-but-not-ignored files, as they are now) in a temporary directory,
# then checks what they contain: the library only under
# /usr/lib/<triplet>/softverbs/ with soname libibverbs.so.1 and no shlibs
# entry, the tools, the header, the Python module.  The extracted library
# must show loop0 to Debian's ibv_devinfo.  lintian errors fail the test
# when lintian is installed.
#
# usage: check_deb.sh [SOURCE_DIR]   (default: this script's tree)
# Exit status: 0 pass, 1 failure, 77 (skip) when the build tools are missing.
# The unit suite is not rerun inside the package build (nocheck).
set -euo pipefail

src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}

for tool in dpkg-buildpackage dh dpkg-deb git readelf; do
	command -v "$tool" >/dev/null || {
		echo "check_deb: $tool missing (bash scripts/setup.sh installs it)" >&2
		exit 77
	}
done
[[ -e /usr/share/perl5/Debian/Debhelper/Sequence/python3.pm ]] || {
	echo "check_deb: dh-python missing" >&2
	exit 77
}

git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1 || {
	echo "check_deb: $src is not a git work tree (the export lists its files with git)" >&2
	exit 77
}

work=$(mktemp -d /tmp/softverbs-deb.XXXXXX)
fabric=check-deb-$$
cleanup() {
	[[ -x $work/root/usr/bin/softverbs ]] &&
		"$work/root/usr/bin/softverbs" clean --force "$fabric" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

failures=0
fail() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}
pass() { echo "ok: $*"; }

echo "== export $src"
mkdir "$work/src"
(cd "$src" && git ls-files -z --cached --others --exclude-standard) |
	(cd "$src" && while IFS= read -r -d '' f; do [[ -e $f || -L $f ]] && printf '%s\0' "$f"; done) |
	tar -C "$src" --null -T - -cf - | tar -C "$work/src" -xf -

echo "== dpkg-buildpackage -b"
start=$SECONDS
if ! (cd "$work/src" &&
	DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" DEB_BUILD_PROFILES=nocheck \
		dpkg-buildpackage -b -uc -us) >"$work/build.log" 2>&1; then
	tail -40 "$work/build.log" >&2
	echo "check_deb: dpkg-buildpackage failed (log above)" >&2
	exit 1
fi
echo "built in $((SECONDS - start)) s"

arch=$(dpkg-architecture -qDEB_HOST_ARCH)
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
version=$(cd "$work/src" && dpkg-parsechangelog -S Version)
privdir=usr/lib/$triplet/softverbs
deb() { echo "$work/${1}_${version}_${arch}.deb"; }

for p in softverbs softverbs-dev python3-softverbs; do
	[[ -f $(deb "$p") ]] && pass "built $p" || fail "package $p not built"
done
[[ $failures -eq 0 ]] || exit 1

mkdir "$work/root"
for p in softverbs softverbs-dev python3-softverbs; do
	dpkg-deb -x "$(deb "$p")" "$work/root"
done
listing() { dpkg-deb -c "$(deb "$1")" | awk '{print $6}' | sed 's|^\./||'; }

echo "== softverbs"
lib=$work/root/$privdir/libibverbs.so.1
if [[ -L $lib && -f $(readlink -f "$lib") ]]; then
	pass "$privdir/libibverbs.so.1 -> $(readlink "$lib")"
else
	fail "$privdir/libibverbs.so.1 missing or not a symlink to the library"
fi
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ $soname == libibverbs.so.1 ]] && pass "soname $soname" || fail "soname '$soname'"
if readelf -d "$lib" | grep -qE 'RPATH|RUNPATH'; then
	fail "library has an RPATH/RUNPATH"
else
	pass "no RPATH"
fi
cm=$work/root/$privdir/librdmacm.so.1
if [[ -L $cm && -f $(readlink -f "$cm") ]]; then
	pass "$privdir/librdmacm.so.1 -> $(readlink "$cm")"
else
	fail "$privdir/librdmacm.so.1 missing or not a symlink to the library"
fi
cmso=$(readelf -d "$cm" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ $cmso == librdmacm.so.1 ]] && pass "soname $cmso" || fail "librdmacm soname '$cmso'"
stray=$(listing softverbs | grep -E 'libibverbs\.so|librdmacm\.so' | grep -v "^$privdir/" || true)
[[ -z $stray ]] && pass "no libibverbs outside $privdir" || fail "libibverbs outside $privdir: $stray"
if dpkg-deb --ctrl-tarfile "$(deb softverbs)" | tar -t | grep -qE 'shlibs|triggers'; then
	fail "control has shlibs/triggers: the private soname must not be registered"
else
	pass "no shlibs or ldconfig trigger"
fi
for t in softverbs softverbs-run; do
	[[ -x $work/root/usr/bin/$t ]] && pass "usr/bin/$t" || fail "usr/bin/$t missing or not executable"
	[[ -f $work/root/usr/share/man/man1/$t.1.gz ]] || fail "man page $t.1 missing"
done
got=$("$work/root/usr/bin/softverbs-run" --libdir)
[[ $got == /$privdir ]] && pass "softverbs-run --libdir $got" || fail "softverbs-run --libdir says '$got'"
depends=$(dpkg-deb -f "$(deb softverbs)" Depends)
[[ $depends == *libnl-route-3* && $depends == *libc6* ]] &&
	pass "Depends: $depends" || fail "Depends lacks shlibs: $depends"

echo "== softverbs-dev, python3-softverbs"
listing softverbs-dev | grep -qx 'usr/include/infiniband/softverbs_dv.h' &&
	pass "softverbs_dv.h" || fail "softverbs_dv.h not in softverbs-dev"
[[ $(readlink "$work/root/$privdir/libibverbs.so" 2>/dev/null) == libibverbs.so.1 ]] &&
	pass "$privdir/libibverbs.so -> libibverbs.so.1" || fail "dev symlink libibverbs.so missing"
[[ $(readlink "$work/root/$privdir/librdmacm.so" 2>/dev/null) == librdmacm.so.1 ]] &&
	pass "$privdir/librdmacm.so -> librdmacm.so.1" || fail "dev symlink librdmacm.so missing"
listing python3-softverbs | grep -qE '^usr/lib/python3/dist-packages/softverbs_fabric\..*\.so$' &&
	pass "softverbs_fabric module" || fail "softverbs_fabric module not in python3-softverbs"
[[ $(dpkg-deb -f "$(deb python3-softverbs)" Depends) == *python3* ]] ||
	fail "python3-softverbs does not depend on python3"

echo "== the packaged library runs ibv_devinfo"
if command -v ibv_devinfo >/dev/null; then
	out=$(LD_LIBRARY_PATH=$work/root/$privdir SOFTVERBS_FABRIC=$fabric SOFTVERBS_CONFIG=/dev/null \
		timeout 60 ibv_devinfo 2>&1) || true
	grep -q 'hca_id:.*loop0' <<<"$out" && pass "ibv_devinfo sees loop0" ||
		fail "ibv_devinfo through the packaged library: $out"
else
	echo "skip: ibv_devinfo not installed"
fi

echo "== the packaged librdmacm connects rping"
if command -v rping >/dev/null; then
	cmenv=(env LD_LIBRARY_PATH=$work/root/$privdir SOFTVERBS_FABRIC=$fabric SOFTVERBS_CONFIG=/dev/null)
	"${cmenv[@]}" timeout 60 rping -s -a 127.0.0.1 -p 7471 -C 10 -V >"$work/rping-s.out" 2>&1 &
	rs=$!
	sleep 1
	out=$("${cmenv[@]}" timeout 60 rping -c -a 127.0.0.1 -p 7471 -C 10 -V -v 2>&1) && rc=0 || rc=$?
	wait "$rs" && src=0 || src=$?
	if [[ $rc -eq 0 && $src -eq 0 ]] && grep -q 'rdma-ping-9:' <<<"$out"; then
		pass "rping -V through the packaged libraries"
	else
		fail "rping through the packaged libraries: client $rc, server $src: $out $(cat "$work/rping-s.out")"
	fi
else
	echo "skip: rping not installed"
fi

if command -v lintian >/dev/null; then
	echo "== lintian"
	lint=$(lintian "$work"/*.changes 2>&1 || true)
	[[ -n $lint ]] && echo "$lint"
	if grep -q '^E:' <<<"$lint"; then fail "lintian errors"; else pass "lintian: no errors"; fi
fi

if [[ $failures -ne 0 ]]; then
	echo "check_deb: $failures check(s) failed" >&2
	exit 1
fi
echo "check_deb: all checks passed"
