#!/usr/bin/env bash
# Run the whole test suite (creates/reuses .venv/ first). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
source "$ROOT/scripts/ros_env.sh"
cd "$ROOT"
# pytest exits 5 when it collects no test: that is a failure here too.
exec "$ROOT/.venv/bin/python" -m pytest tests "$@"
