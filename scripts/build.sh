#!/usr/bin/env bash
# Configures and builds xsilo into BUILD_DIR (default build/). XSILO_SANITIZE=1 builds with
# AddressSanitizer and UndefinedBehaviorSanitizer (into build-asan/ unless BUILD_DIR is set),
# and with the worker-thread checks that RelWithDebInfo's NDEBUG would leave out.
# BUILD_TARGET builds only the named targets (space-separated; the demo needs only `xsilo`).
# Where ccache is installed (scripts/install-deps.sh installs it), compiled objects are kept
# between builds: a rebuild after a pull, or a second build folder with the same flags (the
# Debian package's, beside the demo's), compiles only what differs.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=${XSILO_SANITIZE:-0}
if [ "$sanitize" = 1 ]; then
  build_dir=${BUILD_DIR:-build-asan}
  build_type=RelWithDebInfo  # lowered to -O1 -g1 for the sanitizers (cmake/XsiloTarget.cmake)
else
  build_dir=${BUILD_DIR:-build}
  build_type=${BUILD_TYPE:-Release}
fi
werror=OFF
[ "${CI:-}" = true ] && werror=ON
launcher=""
# base_dir: paths below the checkout are hashed relative to the build folder, so two build
# folders share the cache.
command -v ccache >/dev/null && launcher="env;CCACHE_BASEDIR=$(pwd);ccache"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" -DXSILO_WERROR="$werror" \
  -DXSILO_SANITIZE=$([ "$sanitize" = 1 ] && echo ON || echo OFF) \
  -DXSILO_THREAD_CHECKS=$([ "$sanitize" = 1 ] && echo ON || echo OFF) \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >&2
targets=()
for t in ${BUILD_TARGET:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"${JOBS:-2}" "${targets[@]}" >&2
echo "$build_dir"
