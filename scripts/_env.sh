# Sourced by scripts/demo and scripts/test: a project virtualenv with pinned dependencies.
# torch is pinned by constraints.txt (a local CPU build here; an unpinned torch is multi-GB).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${DLOADER_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV" >&2
  python3 -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "installing dloader and its dependencies (pinned by constraints.txt)..." >&2
"$VENV/bin/python" -m pip install --quiet -c constraints.txt -e ".[dev]" 2>&1 \
  | { grep -v "^WARNING: Location" || true; } >&2
export PATH="$VENV/bin:$PATH"
