#!/usr/bin/env bash
# Builds the Debian package: the portable Release binary (scripts/build.sh) without the CUDA
# backend, then `cpack -G DEB`. Prints the .deb's path on its last line.
#
# Its own build folder (build-package/, or BUILD_DIR): the package must not pick up this
# machine's choices. CUDA off, because a CUDA build links libcudart and libnccl, which no
# Debian package provides and which hosts without a GPU lack (GPU sites build from source,
# docs/operations.md); tests off, because the package needs only the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >&2
build_dir=${BUILD_DIR:-build-package}

# scripts/build.sh does not pass these; a value in the cache stays when it configures again (a
# fuzz build's XSILO_FUZZ=ON among them: its binary remembers public-key results).
cmake -S . -B "$build_dir" -DXSILO_CUDA=OFF -DXSILO_NATIVE=OFF -DXSILO_ARCH=x86-64-v2 \
  -DXSILO_FUZZ=OFF -DBUILD_TESTING=OFF >&2
build_dir=$(BUILD_DIR="$build_dir" BUILD_TYPE=Release XSILO_SANITIZE=0 bash scripts/build.sh | tail -n 1)

# A stale package from an older version would be mistaken for this one.
rm -f "$build_dir"/xsilo_*.deb
(cd "$build_dir" && cpack -G DEB >&2)
deb=$(ls "$build_dir"/xsilo_*.deb)
echo "$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")"
