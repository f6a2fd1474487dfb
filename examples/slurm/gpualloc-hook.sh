#!/bin/sh
# Slurm node hook wrapper for gpualloc: install as Prolog=, Epilog= and TaskProlog= through the
# three symlinks below (gpualloc-prolog, gpualloc-epilog, gpualloc-taskprolog); the name picks
# the hook. slurmd runs hooks with no PATH and a bare environment, so everything is spelled out.
#
# Edit the three settings for your node:
GPUALLOC=${GPUALLOC_BIN:-/opt/gpualloc/bin/gpualloc}  # the gpualloc of a virtual environment
export GPUALLOC_STATE_DIR=${GPUALLOC_STATE_DIR:-/var/tmp/gpualloc}  # the host ledger
# export GPUALLOC_TOPOLOGY=/etc/gpualloc/node.json   # a recorded topology ('gpualloc topo record');
#                                                    # leave unset to discover the node with NVML
case "$(basename "$0")" in
  gpualloc-prolog)     exec "$GPUALLOC" slurm prolog ;;
  gpualloc-epilog)     exec "$GPUALLOC" slurm epilog ;;
  gpualloc-taskprolog) exec "$GPUALLOC" slurm taskprolog ;;
esac
# Never fail the job because of this wrapper: a non-zero Prolog/Epilog drains the node.
echo "gpualloc-hook: called as $(basename "$0"), expected gpualloc-prolog|epilog|taskprolog" >&2
exit 0
