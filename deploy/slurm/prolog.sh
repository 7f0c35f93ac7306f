#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/dloader/prolog.sh): runs as root on each node
# before a job. It only logs whether the node's sidecar answers: a job never waits for it and
# never fails because of it (the loader trains on alone without a sidecar).
SOCKET="${DLOADER_SOCKET:-/run/dloader/sidecar.sock}"
CTL="${DLOADER_CTL:-/opt/dloader/bin/dloaderctl}"
[ -x "$CTL" ] || CTL="$(command -v dloaderctl)" || exit 0
if [ -S "$SOCKET" ] && "$CTL" --socket "$SOCKET" --timeout 2 health >/dev/null 2>&1; then
  logger -t dloader "job ${SLURM_JOB_ID:-?}: sidecar at $SOCKET is serving" 2>/dev/null || true
else
  logger -t dloader "job ${SLURM_JOB_ID:-?}: no sidecar at $SOCKET" 2>/dev/null || true
fi
exit 0
