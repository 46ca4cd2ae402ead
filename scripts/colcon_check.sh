#!/usr/bin/env bash
# The lab's path, checked: colcon build the workspace (repo root) and verify the
# install space has the node executables and the launch/config/urdf files, and
# that an installed executable finds its data through the ament index.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
source "$ROOT/scripts/ros_env.sh"
cd "$ROOT"
rm -rf build/rynn_teleop install/rynn_teleop
"$ROOT/.venv/bin/colcon" --log-base log build --base-paths src --event-handlers console_direct- >/dev/null
PREFIX="install/rynn_teleop"
fail=0
nodes=$("$ROOT/.venv/bin/python" -c "from rynn_teleop.nodes import REGISTRY; print(' '.join(REGISTRY))")
for exe in $nodes rynn-teleop; do
  [[ -x "$PREFIX/lib/rynn_teleop/$exe" ]] || { echo "colcon_check: missing executable lib/rynn_teleop/$exe" >&2; fail=1; }
done
for f in launch/*.launch.py config/*.yaml config/*.xml urdf/*.urdf urdf/*.yaml package.xml; do
  [[ -e "$f" || "$f" == package.xml ]] || continue
  [[ -f "$PREFIX/share/rynn_teleop/$(basename "$(dirname "$f")")/$(basename "$f")" || -f "$PREFIX/share/rynn_teleop/$f" ]] \
    || { echo "colcon_check: $f not installed under share/rynn_teleop" >&2; fail=1; }
done
ls "$PREFIX"/lib/python3*/site-packages/rynn_teleop/console/static/index.html >/dev/null 2>&1 \
  || { echo "colcon_check: the console's page (rynn_teleop/console/static) is not installed" >&2; fail=1; }
[[ -f "$PREFIX/share/ament_index/resource_index/packages/rynn_teleop" ]] || { echo "colcon_check: no ament index marker" >&2; fail=1; }
# An installed executable must find its data in share/ (not in the source tree).
set +u; source install/setup.bash; set -u
"$PREFIX/lib/rynn_teleop/rynn-teleop" urdf --compare urdf/rynn_m6_wuji.urdf \
  || { echo "colcon_check: installed rynn-teleop urdf differs from urdf/rynn_m6_wuji.urdf" >&2; fail=1; }
installed_share=$("$ROOT/.venv/bin/python" -c "import sys; sys.path.insert(0, '$(ls -d $PREFIX/lib/python3*/site-packages)'); import rynn_teleop.paths as p; print(p.share_dir())")
[[ "$installed_share" == "$ROOT/$PREFIX/share/rynn_teleop" ]] || { echo "colcon_check: installed package resolves data to $installed_share" >&2; fail=1; }
((fail == 0)) && echo "colcon_check: install space OK ($PREFIX: $(echo $nodes | wc -w) nodes, launch/config/urdf installed)"
exit $fail
