#!/usr/bin/env bash
# Quick start, command 1: install, build, and run the default experiment: a federation of
# 5 hospitals (real processes, mutual TLS on loopback) training on the breast cancer data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build_dir=$(BUILD_TARGET=xsilo bash scripts/build.sh | tail -n 1)
out=${1:-runs/demo}
"$build_dir/tools/xsilo" sim --out "$out"
