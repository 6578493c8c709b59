#!/usr/bin/env bash
# Lays the package out as symlinks into the working tree at $1 (default: the current directory), the
# way setuptools' package-dir maps it (detent_rl/ plus selir, kernels, rollout, trainer under it), for
# machines where nothing is pip-installed (the device). Prints the folder to put on PYTHONPATH.
set -euo pipefail
root=$(realpath "${1:-.}")
pkg=$(mktemp -d)/pkg
mkdir -p "$pkg/detent_rl"
for f in "$root"/detent_rl/*; do ln -s "$f" "$pkg/detent_rl/"; done
for d in selir kernels rollout trainer; do ln -s "$root/$d" "$pkg/detent_rl/$d"; done
echo "$pkg"
