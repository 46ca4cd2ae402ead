#!/usr/bin/env bash
# Run the digital-teleop demo (creates/reuses .venv/ first). Extra arguments go to `rynn-teleop demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
source "$ROOT/scripts/ros_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/rynn-teleop" demo "$@"
