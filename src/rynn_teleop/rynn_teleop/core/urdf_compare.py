"""Compare two URDF documents by structure and numbers (ROS-free).

Two URDFs are the same when their element trees match tag for tag and
attribute for attribute, and every whitespace-separated token of an attribute
value or element text is either equal as text or, where both parse as
floats, equal within ``tol`` (absolute and relative). The last printed digit
of a float depends on the numeric libraries a machine installed; the robot
does not.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

DEFAULT_TOLERANCE = 1e-12  # [-] absolute and relative, per number


def _tokens_differ(a: str, b: str, tol: float) -> bool:
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return True
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return True
        if not math.isclose(fx, fy, rel_tol=tol, abs_tol=tol):
            return True
    return False


def urdf_differences(a: str, b: str, tol: float = DEFAULT_TOLERANCE, limit: int = 20) -> list[str]:
    """Where URDF texts ``a`` and ``b`` differ (at most ``limit`` entries, each 'path: what'); empty if the same.

    Raises:
        xml.etree.ElementTree.ParseError: a text is not XML.
    """
    out: list[str] = []

    def walk(x: ET.Element, y: ET.Element, path: str) -> None:
        if len(out) >= limit:
            return
        name = x.get("name")
        here = f"{path}/{x.tag}" + (f"[{name}]" if name else "")
        if x.tag != y.tag:
            out.append(f"{here}: element {x.tag!r} vs {y.tag!r}")
            return
        if set(x.attrib) != set(y.attrib):
            out.append(f"{here}: attributes {sorted(x.attrib)} vs {sorted(y.attrib)}")
        for key in sorted(set(x.attrib) & set(y.attrib)):
            if _tokens_differ(x.attrib[key], y.attrib[key], tol):
                out.append(f"{here}@{key}: {x.attrib[key]!r} vs {y.attrib[key]!r}")
        if _tokens_differ(x.text or "", y.text or "", tol):
            out.append(f"{here}: text {(x.text or '').strip()!r} vs {(y.text or '').strip()!r}")
        cx, cy = list(x), list(y)
        if len(cx) != len(cy):
            out.append(f"{here}: {len(cx)} vs {len(cy)} child elements")
        for u, v in zip(cx, cy):
            walk(u, v, here)

    walk(ET.fromstring(a), ET.fromstring(b), "")
    return out[:limit]
