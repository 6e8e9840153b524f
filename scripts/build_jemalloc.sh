#!/usr/bin/env bash
# Builds jemalloc 5.3.0 from Debian's source package as a static, position-independent
# library with a private symbol prefix, for linking into libtide.so with hidden symbols.
#
# Why not Debian's libjemalloc.so.2: it uses initial-exec TLS, so a library linking it cannot
# be dlopen()ed by Python, and its unprefixed malloc would replace the whole process's malloc
# (see docs/design/index.md, "Known pitfalls").
#
# usage: build_jemalloc.sh DEST_DIR     (installs DEST_DIR/include and DEST_DIR/lib)
set -euo pipefail

dest=$(realpath -m "${1:?usage: build_jemalloc.sh DEST_DIR}")
version=5.3.0
stamp="$dest/.built-$version"
[[ -f $stamp ]] && exit 0
# Several builds may configure at once (build/, build-asan/, ...): one builds, the others wait.
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9
[[ -f $stamp ]] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

if ! apt-get source --download-only "jemalloc=$version-1" >apt-source.log 2>&1 &&
   ! apt-get source --download-only jemalloc >>apt-source.log 2>&1; then
  cat apt-source.log >&2
  echo "build_jemalloc.sh: 'apt-get source jemalloc' failed; add a deb-src entry" \
       "(scripts/bootstrap.sh does) and run 'apt-get update'" >&2
  exit 1
fi
tarball=$(ls jemalloc_"$version".orig.tar.* 2>/dev/null | head -n1)
[[ -n $tarball ]] || { echo "build_jemalloc.sh: no jemalloc $version source in the package" >&2; exit 1; }
tar xf "$tarball"
cd "jemalloc-$version"

# retain:false by default: jemalloc's retained-extent growth otherwise asks the extent hooks
# for about 2.4x what was requested, and every byte the hooks get is pinned.
./configure --with-jemalloc-prefix=tide_je_ --with-private-namespace=tide_je_internal_ \
  --disable-initial-exec-tls --without-export --disable-shared --with-pic \
  --disable-cxx --disable-prof --disable-libdl \
  --with-malloc-conf=retain:false >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
make -j"$(nproc)" build_lib_static >make.log 2>&1 || { tail -40 make.log >&2; exit 1; }

mkdir -p "$dest/lib" "$dest/include/jemalloc"
cp lib/libjemalloc_pic.a "$dest/lib/"
cp include/jemalloc/jemalloc.h "$dest/include/jemalloc/"
touch "$stamp"
echo "jemalloc $version built into $dest"
