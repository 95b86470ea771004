#!/usr/bin/env bash
# Quick start, command 2: install, build, and run every test. In CI (CI=true) the build uses
# AddressSanitizer + UndefinedBehaviorSanitizer and warnings are errors.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/python-extras.sh  # tensorboard's reader and mlflow for their tests (they skip without)
if [ "${CI:-}" = true ] && [ -z "${XSILO_SANITIZE:-}" ]; then export XSILO_SANITIZE=1; fi
build_dir=$(bash scripts/build.sh | tail -n 1)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" --output-on-failure -j"${JOBS:-2}" --timeout 600 "$@"
