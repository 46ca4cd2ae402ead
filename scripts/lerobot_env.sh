#!/usr/bin/env bash
# Create or reuse the separate LeRobot environment (.venv-lerobot/, or $RYNN_LEROBOT_VENV) in which the
# tests load exported datasets with LeRobot's own LeRobotDataset. Prints that environment's python on
# stdout. Idempotent: re-running is a no-op unless requirements/lerobot.txt or this script changed.
#
# Why a separate environment: LeRobot (0.4.x, the last release for Python 3.11, which reads the v3.0
# format) pins torch < 2.11 and its dataset reader imports torchvision; the stack's .venv has
# torch 2.13.0+cpu and no torchvision. Here torch + torchvision are a matching pair, and lerobot is
# installed without its dependency pins (--no-deps) next to the dataset packages it imports.
# torchcodec (LeRobot's video decoder) needs FFmpeg's shared libraries: Debian's package is
# installed when run as root, otherwise the apt-get line to run is printed.
#
# Exit codes: 0 ready; 3 cannot be created because the package registry cannot be reached (the tests
# skip then); anything else is a failure (the tests fail then).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RYNN_LEROBOT_VENV:-$ROOT/.venv-lerobot}"
REQ="$ROOT/requirements/lerobot.txt"
want="$(cat "$REQ" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$VENV/.lerobot-stamp" && "$(cat "$VENV/.lerobot-stamp")" == "$want" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi

# FFmpeg shared libraries for torchcodec.
if ! ldconfig -p 2>/dev/null | grep -q 'libavcodec\.so\.'; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "lerobot_env: installing Debian's FFmpeg libraries (torchcodec decodes LeRobot's videos with them)" >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null; }; then
      echo "lerobot_env: apt-get could not install ffmpeg" >&2
      exit 3
    fi
  else
    echo "lerobot_env: FFmpeg's libraries are missing; run: sudo apt-get install ffmpeg" >&2
    exit 1
  fi
fi

# Python 3.11 where available: the torch wheels this environment pins exist for it.
PY="${LEROBOT_PYTHON:-}"
if [[ -z "$PY" ]]; then
  PY="$(command -v python3.11 || command -v python3)"
fi
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
  echo "lerobot_env: Python 3.10+ is required (found $("$PY" --version))" >&2; exit 1; }

echo "lerobot_env: setting up $VENV (first run: a few minutes, several GB)" >&2
rm -rf "$VENV"  # the stamp is written last: an environment without it is incomplete
"$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
# Two steps: everything with its own dependencies resolved, then the packages marked "# no-deps"
# without theirs (LeRobot's torch pin would otherwise replace the torch pinned here).
deps=(); nodeps=()
while IFS= read -r line; do
  spec="${line%%#*}"; spec="${spec//[[:space:]]/}"
  [[ -z "$spec" ]] && continue
  if [[ "$line" == *"# no-deps"* ]]; then nodeps+=("$spec"); else deps+=("$spec"); fi
done < "$REQ"
if ! "${pip[@]}" "${deps[@]}" >"$LOG" 2>&1 || ! "${pip[@]}" --no-deps "${nodeps[@]}" >>"$LOG" 2>&1; then
  cat "$LOG" >&2
  if ! "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$(mktemp -d)" "${nodeps[0]}" >/dev/null 2>&1; then
    echo "lerobot_env: the package registry cannot be reached; the LeRobot environment cannot be created" >&2
    exit 3
  fi
  echo "lerobot_env: installing requirements/lerobot.txt failed (see above)" >&2
  exit 1
fi
echo "$want" > "$VENV/.lerobot-stamp"
echo "$VENV/bin/python"
