#!/usr/bin/env bash
# Installs what building and testing tide needs, skipping what is already there:
# Debian packages (apt), a deb-src entry (jemalloc is built from Debian's source package), and
# the project's Python environment .venv (python/requirements.txt).
#
# usage: scripts/bootstrap.sh [--python]    (--python: also the .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "bootstrap: $*"; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

packages=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev
          libbenchmark-dev libunwind-dev clang-format clang-tidy python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

deb_src=/etc/apt/sources.list.d/tide-deb-src.sources
need_update=0
if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  log "adding a deb-src entry ($deb_src) for jemalloc's source package"
  as_root tee "$deb_src" >/dev/null <<SOURCES
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  need_update=1
fi
if [[ ${#missing[@]} -gt 0 || $need_update -eq 1 ]]; then
  log "apt-get update"
  as_root apt-get update -qq || log "apt-get update reported errors; continuing"
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The CUDA toolkit (nvcc and cuda.h, 12.0 or newer) compiles the kernels; no driver is needed.
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "bootstrap: the CUDA toolkit (nvcc, 12.0 or newer) is missing: install it from" \
       "NVIDIA's packages, or put its bin/ on PATH" >&2
  exit 1
fi

if [[ ${1:-} == --python ]]; then
  venv=.venv
  stamp=$venv/.requirements
  if [[ ! -x $venv/bin/python ]]; then
    log "creating $venv"
    python3 -m venv "$venv"
  fi
  if ! cmp -s python/requirements.txt "$stamp"; then
    log "installing python/requirements.txt into $venv (PyTorch is large: minutes on a fresh machine)"
    # PyTorch with its CUDA libraries takes about 6 GiB installed; pip's wheel cache would keep
    # another 3 GiB of downloads that nothing reads again, so it is off. The build trees and the
    # sanitizer builds of `make test` take about 4 GiB more.
    need_kib=$((10 * 1024 * 1024))
    free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
    if [[ $free_kib =~ ^[0-9]+$ && $free_kib -lt $need_kib ]]; then
      log "warning: $((free_kib / 1024)) MiB free on the file system of $PWD;" \
          "the venv, the build and the tests need about $((need_kib / 1024)) MiB"
    fi
    if ! "$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
         -r python/requirements.txt; then
      echo "bootstrap: pip could not install python/requirements.txt into $venv" \
           "($(df -Pk . | awk 'NR == 2 { print int($4 / 1024) }') MiB free now); see pip's error above" >&2
      exit 1
    fi
    cp python/requirements.txt "$stamp"
  fi
  # The package itself, from the source tree (an editable install without a second C++ build:
  # tide finds build/lib/libtide.so next to the sources), importable from any directory.
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$PWD/python" >"$site/tide-source.pth"
  # ... and the `tide` command pip would install (tide.cli, which runs build/bin/tide).
  printf '#!/bin/sh\nexec "%s" -m tide.cli "$@"\n' "$PWD/$venv/bin/python" >"$venv/bin/tide"
  chmod +x "$venv/bin/tide"
fi
