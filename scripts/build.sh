#!/usr/bin/env bash
# Configures and builds xsilo into BUILD_DIR (default build/). XSILO_SANITIZE=1 builds with
# AddressSanitizer and UndefinedBehaviorSanitizer (into build-asan/ unless BUILD_DIR is set).
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=${XSILO_SANITIZE:-0}
if [ "$sanitize" = 1 ]; then
  build_dir=${BUILD_DIR:-build-asan}
  build_type=RelWithDebInfo  # -O2 -g: sanitizers stay exact, Eigen stays fast
else
  build_dir=${BUILD_DIR:-build}
  build_type=${BUILD_TYPE:-Release}
fi
werror=OFF
[ "${CI:-}" = true ] && werror=ON
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" -DXSILO_WERROR="$werror" \
  -DXSILO_SANITIZE=$([ "$sanitize" = 1 ] && echo ON || echo OFF) >&2
cmake --build "$build_dir" -j"${JOBS:-2}" >&2
echo "$build_dir"
