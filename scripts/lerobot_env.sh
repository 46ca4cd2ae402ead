#!/usr/bin/env bash
# Create or reuse the separate LeRobot environment (.venv-lerobot/, or $RYNN_LEROBOT_VENV): the tests load
# exported datasets with LeRobot's own LeRobotDataset in it, the policy node's worker runs trained policies
# in it, and `lerobot-train` trains them in it. Prints that environment's python on stdout. Idempotent:
# re-running is a no-op unless requirements/lerobot.txt or this script changed; then the environment is
# made again from scratch (an older one, e.g. LeRobot 0.4.4 on Python 3.11, is replaced).
#
# Why a separate environment: LeRobot 0.6.1 needs Python >= 3.12 and pins torch < 2.12 (with
# torchvision, torchcodec, numpy < 2.3); the stack's .venv is Python 3.11 with torch 2.13.0+cpu and no
# torchvision. requirements/lerobot.txt is this environment's own lock (pip freeze), so the .venv's
# pins stay as they are. torchcodec (LeRobot's video decoder) needs FFmpeg's shared libraries: Debian's
# package is installed when run as root, otherwise the apt-get line to run is printed.
#
# Python 3.12+ is looked for in this order: $LEROBOT_PYTHON; `python3.12` on PATH (if it runs: a pyenv
# shim for a version that is not selected does not); $PYENV_ROOT (or ~/.pyenv, or `pyenv root`)
# versions/3.12*/bin/python3.12, then 3.13.
#
# Exit codes: 0 ready; 3 cannot be created because the package registry cannot be reached (the tests
# skip then); anything else is a failure (the tests fail then; 1 also when no Python 3.12+ is found).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RYNN_LEROBOT_VENV:-$ROOT/.venv-lerobot}"
REQ="$ROOT/requirements/lerobot.txt"
want="$(cat "$REQ" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$VENV/.lerobot-stamp" && "$(cat "$VENV/.lerobot-stamp")" == "$want" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi

# Python 3.12+ (requirements/lerobot.txt was resolved under 3.12).
runs_312() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
PY=""
if [[ -n "${LEROBOT_PYTHON:-}" ]]; then
  if ! runs_312 "$LEROBOT_PYTHON"; then
    echo "lerobot_env: LEROBOT_PYTHON=$LEROBOT_PYTHON is not a working Python 3.12+ (LeRobot 0.6 needs one)" >&2
    exit 1
  fi
  PY="$LEROBOT_PYTHON"
else
  candidates=()
  on_path="$(command -v python3.12 || true)"
  if [[ -n "$on_path" ]]; then candidates+=("$on_path"); fi
  pyenv_roots=("${PYENV_ROOT:-$HOME/.pyenv}")
  if command -v pyenv >/dev/null; then pyenv_roots+=("$(pyenv root 2>/dev/null || true)"); fi
  for r in "${pyenv_roots[@]}"; do
    for v in 12 13; do
      for p in "$r"/versions/3."$v"*/bin/python3."$v"; do [[ -x "$p" ]] && candidates+=("$p"); done
    done
  done
  for c in "${candidates[@]}"; do
    if runs_312 "$c"; then PY="$c"; break; fi
  done
  if [[ -z "$PY" ]]; then
    echo "lerobot_env: no Python 3.12+ found (LeRobot 0.6 needs one). Looked at: LEROBOT_PYTHON (unset)," \
         "python3.12 on PATH (${on_path:-not found}${on_path:+: does not run}), and" \
         "${pyenv_roots[*]/%//versions/3.1[23]*/bin/python3.1[23]}." \
         "Install one (e.g. pyenv install 3.12) or set LEROBOT_PYTHON=/path/to/python3.12" >&2
    exit 1
  fi
fi

# FFmpeg shared libraries for torchcodec.
if ! PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep -q 'libavcodec\.so\.'; then
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

echo "lerobot_env: setting up $VENV with $("$PY" --version) (first run: a few minutes, about 5.5 GB)" >&2
rm -rf "$VENV"  # the stamp is written last: an environment without it is incomplete
"$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
LOG="$(mktemp)"
PROBE="$(mktemp -d)"
trap 'rm -rf "$LOG" "$PROBE"' EXIT
# Two steps: everything with its own dependencies resolved, then any package marked "# no-deps" without
# its dependencies.
deps=(); nodeps=()
while IFS= read -r line; do
  spec="${line%%#*}"; spec="${spec//[[:space:]]/}"
  [[ -z "$spec" ]] && continue
  if [[ "$line" == *"# no-deps"* ]]; then nodeps+=("$spec"); else deps+=("$spec"); fi
done < "$REQ"
if ! "${pip[@]}" "${deps[@]}" >"$LOG" 2>&1 \
    || { [[ ${#nodeps[@]} -gt 0 ]] && ! "${pip[@]}" --no-deps "${nodeps[@]}" >>"$LOG" 2>&1; }; then
  grep -v "is ignored: it is neither a file nor a directory" "$LOG" >&2 || true
  if ! "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$PROBE" "${deps[0]}" >/dev/null 2>&1; then
    echo "lerobot_env: the package registry cannot be reached; the LeRobot environment cannot be created" >&2
    exit 3
  fi
  echo "lerobot_env: installing requirements/lerobot.txt failed (see above)" >&2
  exit 1
fi
echo "$want" > "$VENV/.lerobot-stamp"
echo "$VENV/bin/python"
