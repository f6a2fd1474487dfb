#!/usr/bin/env bash
# Check gpualloc on a machine with a real NVIDIA driver, and record what the machine says.
#
#   scripts/device_check.sh OUTDIR [WHEELHOUSE]
#
# Run from the checkout's root. WHEELHOUSE (default .wheelhouse, made here by
# scripts/build_wheelhouse.sh for a machine without network) holds the gpualloc wheel and any
# dependency that machine lacks, plus optional Debian packages (numactl, libnuma1) unpacked under
# /tmp when numactl is missing. Everything lands in OUTDIR, one file per command, each starting
# under a header naming the command, the UTC time and the host (the fixtures' form):
#
#   nvidia-smi-q.txt, topo-m.txt, nvlink-s.txt, numactl-H.txt   what the machine says
#   gpualloc-*.txt / *.json                                       what gpualloc makes of it
#   gpualloc-broker-*.txt / .json, broker-log.txt                 the same through a broker
#   pytest-gpu.txt                                                the `pytest -m gpu` tier
#   summary.txt                            one line per step with its exit status, and the verdict
#
# Against NVIDIA's mock NVML (LD_LIBRARY_PATH and MOCK_NVML_CONFIG set) it is a dry run: the
# nvidia-smi steps record that nvidia-smi is missing and the gpu tier skips, saying why.
# Exit status: 0 when every gpualloc step and the gpu tier passed, 1 otherwise.
set -uo pipefail

out=${1:?usage: scripts/device_check.sh OUTDIR [WHEELHOUSE]}
wheelhouse=${2:-.wheelhouse}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
failed=0

if compgen -G "$wheelhouse/*.whl" >/dev/null; then
    site=$(mktemp -d /tmp/gpualloc-site.XXXXXX)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$wheelhouse"/*.whl || { echo "cannot install $wheelhouse" | tee -a "$summary"; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
fi
if ! command -v numactl >/dev/null && compgen -G "$wheelhouse/*.deb" >/dev/null; then
    root=$(mktemp -d /tmp/numactl-root.XXXXXX)
    for deb in "$wheelhouse"/*.deb; do dpkg -x "$deb" "$root"; done
    export PATH="$root/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$(dirname "$(find "$root" -name 'libnuma.so.1' | head -1)")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export GPUALLOC_STATE_DIR="${GPUALLOC_STATE_DIR:-$(mktemp -d /tmp/gpualloc-state.XXXXXX)}"
export GPUALLOC_CACHE_DIR="${GPUALLOC_CACHE_DIR:-$(mktemp -d /tmp/gpualloc-cache.XXXXXX)}"

# record NAME REQUIRED COMMAND...: run COMMAND, save its output as OUTDIR/NAME under a header in
# the fixtures' form (tests/fixtures/measured/README.md: '# ' lines, a blank line, then the
# output verbatim); its exit status goes to summary.txt. A REQUIRED (1) step that fails fails
# the check.
record() {
    local name=$1 required=$2 status
    shift 2
    {
        echo "# captured-by: $*"
        echo "# captured-at: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), by scripts/device_check.sh"
        echo
    } >"$out/$name"
    "$@" >>"$out/$name" 2>&1
    status=$?
    printf '%-28s exit %-3s %s\n' "$name" "$status" "$*" >>"$summary"
    if [ "$status" != 0 ] && [ "$required" = 1 ]; then failed=1; fi
}

gpualloc() { python3 -m gpualloc "$@"; }

# Under the mock there is no CUDA driver: the steps that start a CUDA process are not required.
cuda_required=1
if [ -n "${MOCK_NVML_CONFIG:-}" ]; then cuda_required=0; fi

record versions.txt 0 python3 -c 'import platform, gpualloc, msgspec, pynvml
print(platform.platform(), platform.python_version())
print("gpualloc", gpualloc.__version__, gpualloc.__file__)
print("msgspec", msgspec.__version__, "nvidia-ml-py", pynvml.__file__)'
record nvidia-smi.txt 0 nvidia-smi
record nvidia-smi-q.txt 0 nvidia-smi -q
record topo-m.txt 0 nvidia-smi topo -m
record nvlink-s.txt 0 nvidia-smi nvlink -s
record mig-lgi.txt 0 nvidia-smi mig -lgi
record numactl-H.txt 0 numactl -H

record gpualloc-topo-show.txt 1 gpualloc topo show
record gpualloc-topo-show.json 1 gpualloc topo show --json
record gpualloc-topo-record.json 1 gpualloc topo record -o "$out/recorded-topology.json"
record gpualloc-doctor.txt 0 gpualloc doctor
record gpualloc-status.txt 1 gpualloc status
record gpualloc-plan.txt 1 gpualloc plan -n 1 --explain
record gpualloc-run-dry.txt 1 gpualloc run -n 1 --dry-run -- true
record gpualloc-run-cuda.txt "$cuda_required" gpualloc run -n 1 -- python3 tests/cuda_context.py
record gpualloc-status-after.json 1 gpualloc status --json
record gpualloc-metrics.txt 1 gpualloc metrics
record gpualloc-calibrate.json 0 gpualloc calibrate --json --repeats 2 --size-mib 64
record gpualloc-run-binding.txt 1 gpualloc run -n 1 -- sh -c \
    'grep -E "^(Cpus|Mems)_allowed_list" /proc/self/status; env | grep -E "^(CUDA|GPUALLOC)_" | sort'
if nvidia-smi topo -m >"$out/topo-m.raw" 2>/dev/null; then
    record gpualloc-topo-import.txt 0 gpualloc topo import "$out/topo-m.raw" --json
fi
record gpualloc-api-hold.txt 1 python3 -c 'import gpualloc.api as api
with api.hold(1) as held:
    print(held.gpus, held.environment)'

# Through a broker of this run's own, on this machine's real NVML: the same CUDA job, placed and
# recorded by the broker, and the ledger empty again after it.
broker_dir=$(mktemp -d /tmp/gpualloc-broker.XXXXXX)
{
    echo "# captured-by: gpualloc serve --socket SOCKET --state-dir DIR (its log, stderr)"
    echo "# captured-at: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), by scripts/device_check.sh"
    echo
} >"$out/broker-log.txt"
python3 -m gpualloc serve --socket "$broker_dir/sock" --state-dir "$broker_dir/state" \
    >>"$out/broker-log.txt" 2>&1 &
broker_pid=$!
for _ in $(seq 150); do [ -S "$broker_dir/sock" ] && break; sleep 0.1; done
export GPUALLOC_BROKER="$broker_dir/sock"
record gpualloc-broker-run-cuda.txt "$cuda_required" gpualloc run -n 1 -- python3 tests/cuda_context.py
record gpualloc-broker-status.json 1 gpualloc status --json
record gpualloc-broker-doctor.txt 0 gpualloc doctor
unset GPUALLOC_BROKER
kill "$broker_pid" 2>/dev/null
wait "$broker_pid" 2>/dev/null

if [ -f "$wheelhouse/probe_nvml.py" ]; then  # NVIDIA's mock's probe: every NVML call gpualloc makes
    record nvml-probe.txt 0 python3 "$wheelhouse/probe_nvml.py"
fi
record pytest-gpu.txt 1 python3 -m pytest -m gpu tests/test_gpu_real.py -v -p no:cacheprovider

if [ "$failed" = 0 ]; then verdict="device check: passed"; else verdict="device check: FAILED"; fi
echo "$verdict" >>"$summary"
cat "$summary"
exit "$failed"
