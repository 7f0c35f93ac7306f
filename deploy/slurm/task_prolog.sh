#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/dloader/task_prolog.sh): runs as the
# job's user before each task; every "export NAME=value" line it prints is set in the task's
# environment. It points each task's dloader.DataLoader at the node's sidecar and names the
# job, so that the Epilog can find the job's loaders. It prints nothing (and the task runs
# without a sidecar) if the socket is not there.
SOCKET="${DLOADER_SOCKET:-/run/dloader/sidecar.sock}"
[ -S "$SOCKET" ] || exit 0
echo "export DLOADER_SIDECAR=unix://$SOCKET"
echo "export DLOADER_JOB_NAME=slurm-${SLURM_JOB_ID:-0}-${SLURM_STEP_ID:-0}-${SLURM_PROCID:-0}"
