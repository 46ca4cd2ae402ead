"""Where the package's data (config/, urdf/, launch/) lives.

Two layouts are supported:

* source tree (``pip install -e``, ``PYTHONPATH=src/rynn_teleop``, or
  ``colcon build --symlink-install``): the folders at the repository root;
* installed (``colcon build``, or a plain ``pip install``): the package share
  directory ``<prefix>/share/rynn_teleop``, found through the ament index.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from .errors import ConfigurationError

PACKAGE = "rynn_teleop"
_DATA_DIRS = ("config", "urdf", "launch")


def _has_data(root: Path) -> bool:
    return all((root / d).is_dir() for d in _DATA_DIRS)


@lru_cache(maxsize=1)
def share_dir() -> Path:
    """The directory that holds ``config/``, ``urdf/`` and ``launch/``."""
    source_root = Path(__file__).resolve().parents[3]
    if _has_data(source_root):
        return source_root
    candidates = []
    try:
        from ament_index_python.packages import (  # optional dependency
            PackageNotFoundError,
            get_package_share_directory,
        )

        try:
            candidates.append(Path(get_package_share_directory(PACKAGE)))
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    candidates.append(Path(sys.prefix) / "share" / PACKAGE)
    for candidate in candidates:
        if _has_data(candidate):
            return candidate
    raise ConfigurationError(
        f"cannot find the {PACKAGE} data folders {_DATA_DIRS}: looked in {source_root} "
        f"and {', '.join(map(str, candidates))}; build with colcon or install the package"
    )


def config_file(name: str) -> Path:
    """Path of ``config/<name>`` (``name`` may omit the ``.yaml`` suffix)."""
    if not Path(name).suffix:
        name += ".yaml"
    return share_dir() / "config" / name


def urdf_file(name: str) -> Path:
    """Path of ``urdf/<name>``."""
    return share_dir() / "urdf" / name
