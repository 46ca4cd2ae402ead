#!/usr/bin/env bash
# Lint, then run the whole test suite (creates/reuses .venv/ first). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
source "$ROOT/scripts/ros_env.sh"
cd "$ROOT"
# The linter first (ruff.toml): a finding fails the run before any test starts.
"$ROOT/.venv/bin/ruff" check .
# pytest exits 5 when it collects no test: that is a failure here too.
exec "$ROOT/.venv/bin/python" -m pytest tests "$@"
