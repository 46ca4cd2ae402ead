#!/usr/bin/env bash
# Lint, build the documentation site, then run the whole test suite (creates/reuses .venv/ first). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
source "$ROOT/scripts/ros_env.sh"
cd "$ROOT"
# The linter first (ruff.toml): a finding fails the run before any test starts.
"$ROOT/.venv/bin/ruff" check .
# The documentation site (mkdocs.yml), strict: a broken link or anchor, a page missing from the navigation or a
# reference page the code cannot generate (docs/gen_reference.py) fails the run before any test starts.
NO_MKDOCS_2_WARNING=1 "$ROOT/.venv/bin/mkdocs" build --strict --quiet
# pytest exits 5 when it collects no test: that is a failure here too.
exec "$ROOT/.venv/bin/python" -m pytest tests "$@"
