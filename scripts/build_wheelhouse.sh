#!/usr/bin/env bash
# Build a wheelhouse for scripts/device_check.sh on a GPU machine that has no network.
#
#   scripts/build_wheelhouse.sh [DIR] [PYTHON_VERSION]
#
# DIR (default .wheelhouse) receives the gpualloc wheel built from this checkout, binary wheels
# for PYTHON_VERSION (default 3.12) of the dependencies a CUDA image may lack or hold in another
# version (the versions installed here, so the machine runs what the tests ran), and the Debian
# packages of numactl and libnuma1 (unpacked under /tmp there when numactl is missing).
set -euo pipefail

dir=${1:-.wheelhouse}
python_version=${2:-3.12}
mkdir -p "$dir"
rm -f "$dir"/*.whl "$dir"/*.deb

python3 -m pip wheel --quiet --no-deps -w "$dir" .

# What the gpualloc wheel needs beyond what such an image ships (torch, numpy, rich, psutil and
# networkx are there), pinned to what this environment runs.
packages=(msgspec nvidia-ml-py)
pins=()
for package in "${packages[@]}"; do
    version=$(python3 -m pip show "$package" 2>/dev/null | sed -n 's/^Version: //p')
    pins+=("$package${version:+==$version}")
done
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platforms[@]}" -d "$dir" "${pins[@]}"

if command -v apt-get >/dev/null; then
    (cd "$dir" && apt-get download numactl libnuma1 >/dev/null 2>&1) \
        || echo "build_wheelhouse: numactl's packages could not be downloaded; binding is unchecked"
fi
ls -1 "$dir"
