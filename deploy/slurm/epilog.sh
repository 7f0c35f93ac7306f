#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/dloader/epilog.sh): runs as root on each node
# after a job; ends the job's loaders at the node's sidecar at once (it would notice their
# processes are gone within a period anyway), so their workers and CPU go to other jobs.
# Never fails the node: a missing sidecar or dloaderctl is not an error.
SOCKET="${DLOADER_SOCKET:-/run/dloader/sidecar.sock}"
CTL="${DLOADER_CTL:-/opt/dloader/bin/dloaderctl}"
[ -S "$SOCKET" ] || exit 0
[ -x "$CTL" ] || CTL="$(command -v dloaderctl)" || exit 0
"$CTL" --socket "$SOCKET" --timeout 5 end --name-prefix "slurm-${SLURM_JOB_ID:?}-" || true
exit 0
