#!/usr/bin/env bash
# Refresh requirements/constraints.txt: resolve requirements/*.txt afresh (newest versions the index offers)
# in a throwaway venv and record every resolved version. Then run ./scripts/test.sh (which installs
# exactly the new lock into .venv/) and commit the lock with the change that CI tested.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m venv "$TMP/venv"
# every role's file (the same list as scripts/bootstrap.sh): one lock covers the runtime and every extra
reqs=()
for role in ros-pypi core vendor world-model training export dev bench docs; do reqs+=(-r "$ROOT/requirements/$role.txt"); done
"$TMP/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${reqs[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
{
  echo "# Every package version CI tested, resolved from requirements/*.txt (scripts/bootstrap.sh installs with"
  echo "# these constraints). Refresh: ./scripts/lock.sh, then ./scripts/test.sh, then commit both together."
  "$TMP/venv/bin/python" -m pip freeze --exclude-editable --all | grep -v -E '^(pip|setuptools|wheel)==' | LC_ALL=C sort -f
} > "$ROOT/requirements/constraints.txt"
echo "lock: wrote $(grep -c '==' "$ROOT/requirements/constraints.txt") pins to requirements/constraints.txt" >&2
