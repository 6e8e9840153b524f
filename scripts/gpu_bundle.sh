#!/usr/bin/env bash
# `make gpu-bundle`: the build outputs a lent GPU machine needs, in one archive, out/gpu-bundle.tar.gz.
#
# Those machines have no network and no build tools for tide (no GoogleTest, no Google Benchmark, no
# apt, no pip), and only one ignored file of under 60 MiB travels with the tree. So this packs,
# debug info stripped, what `GPU_BUNDLE=out/gpu-bundle.tar.gz make gpu-check` unpacks into build/
# there: the libraries, every executable (tests, benchmarks, the `tide` command), what the Python
# tests use beside them (build/_startup, the interposer tests' fake CUDA libraries), the shared
# libraries they load that such a machine lacks (libunwind.so.8, which the interposer dlopens),
# the C++ tests' manifest (scripts/ctest_manifest.py: ctest's own files hold this tree's absolute
# paths) and what the archive was built from (build/gpu-bundle.json).
set -euo pipefail
cd "$(dirname "$0")/.."

out=out/gpu-bundle.tar.gz
limit_mib=60
stage=out/gpu-bundle.stage
python=${PYTHON:-.venv/bin/python}

for f in build/lib/libtide.so build/lib/libtide_standin_cuda.so build/bin/tide; do
  [[ -f $f ]] || { echo "gpu-bundle: $f is missing: run make build first" >&2; exit 1; }
done

rm -rf "$stage"
mkdir -p "$stage/build/lib/bundled" "$stage/build/bin" "$stage/build/tests/interpose"
cp -a build/lib/*.so "$stage/build/lib/"
cp -a build/_startup "$stage/build/"
cp -a build/tests/interpose/fakecuda "$stage/build/tests/interpose/"
find build/bin -maxdepth 1 -type f -perm -u+x -exec cp -a {} "$stage/build/bin/" \;

# Shared libraries: the ones loaded at run time by name (dlopen), and any NEEDED library outside
# what every machine that runs PyTorch has.
base='^(linux-vdso|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'
needed=(libunwind.so.8)
mapfile -t elves < <(find "$stage/build" -type f \( -name '*.so*' -o -perm -u+x \) \
                       -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
while read -r name; do
  [[ $name =~ $base ]] || needed+=("$name")
done < <(for f in "${elves[@]}"; do readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done |
         sort -u | grep -v -x -F -f <(cd "$stage/build" && find . -type f -printf '%f\n'))
for name in $(printf '%s\n' "${needed[@]}" | sort -u); do
  # All of ldconfig's output is read: an early exit would end it with SIGPIPE, failing under pipefail.
  path=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ && !found {print $NF; found = 1}')
  [[ -n $path ]] || { echo "gpu-bundle: $name (needed) is not installed here" >&2; exit 1; }
  cp -L "$path" "$stage/build/lib/bundled/$name"
  elves+=("$stage/build/lib/bundled/$name")
done

# Debug info is most of the build's size (RelWithDebInfo); symbols stay for stack traces.
strip --strip-debug "${elves[@]}"

"$python" scripts/ctest_manifest.py generate build "$stage/build/ctest-manifest.json"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=false
[[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || dirty=true
glibc=$(for f in "${elves[@]}"; do objdump -T "$f" 2>/dev/null; done |
        grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -n1)
glibcxx=$(for f in "${elves[@]}"; do objdump -T "$f" 2>/dev/null; done |
          grep -o 'GLIBCXX_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -n1)
archs=$(sed -n 's/^TIDE_CUDA_ARCHS:[A-Z]*=//p' build/CMakeCache.txt)
cat >"$stage/build/gpu-bundle.json" <<JSON
{"commit": "$commit", "dirty": $dirty, "built": "$(date -u +%FT%TZ)", "host": "$(hostname)",
 "cuda_archs": "$archs", "needs": {"glibc": "$glibc", "glibcxx": "$glibcxx"},
 "bundled_libraries": [$(printf '"%s",' "${needed[@]}" | sed 's/,$//')]}
JSON

# Written beside it and renamed: a failed or interrupted run leaves the last bundle as it was.
tar -C "$stage" -czf "$out.partial" build
rm -rf "$stage"
mv -f "$out.partial" "$out"
bytes=$(stat -c %s "$out")
echo "gpu-bundle: $out, $((bytes / 1024 / 1024)) MiB ($bytes bytes): $(tar -tzf "$out" | grep -c -v '/$')" \
     "files; commit ${commit:0:12}$([[ $dirty == true ]] && echo ' (with uncommitted changes)')"
if ((bytes > limit_mib * 1024 * 1024)); then
  echo "gpu-bundle: $out is over $limit_mib MiB: it cannot travel to a GPU machine" >&2
  exit 1
fi
