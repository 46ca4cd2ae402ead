"""The console's action log: who did what, when, and what the stack answered (ROS-free).

Every action the console accepted (it passed the access rules and was well formed) becomes an
:class:`ActionRecord`, whatever the stack answered (done, refused, a node missing). The server keeps the
newest in an :class:`ActionLog` (shown on the page, ``GET /api/state`` ``access.actions``) and hands each to
a listener: the console node logs it and publishes it in its ``/diagnostics`` status (``action.last``), which
the recorder writes into the episode being recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_SHOWN_CHARS = 200  # a field value or result longer than this is cut in the log (with "...")
KEEP = 50  # records the log keeps


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class ActionRecord:
    """One accepted action."""

    time_s: float  # Unix time [s] the answer was known
    client: str  # the peer's address (host of the TCP connection)
    origin: str  # the request's Origin ('': a client that is not a browser, e.g. curl)
    action: str
    fields: Mapping[str, str] = field(default_factory=dict)
    ok: bool = False  # the stack did it
    status: int = 0  # the HTTP status answered (200 done, 409 refused by the stack, 503 a node missing)
    result: str = ""  # the stack's message

    def to_dict(self) -> dict[str, Any]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.time_s)) + f".{int(self.time_s % 1 * 1e3):03d}Z"
        return {"time": stamp, "t": round(self.time_s, 3), "client": self.client, "origin": self.origin,
                "action": self.action, "fields": {k: _cut(v) for k, v in self.fields.items()}, "ok": self.ok,
                "status": self.status, "result": _cut(self.result)}

    def to_json(self) -> str:
        """One JSON line (the log, the diagnostics value ``action.last``)."""
        return json.dumps(self.to_dict(), sort_keys=True)


class ActionLog:
    """The newest :data:`KEEP` records (any thread) and a listener called with each new one."""

    def __init__(self, keep: int = KEEP, on_record: Callable[[ActionRecord], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._records: deque[ActionRecord] = deque(maxlen=keep)
        self.accepted = 0  # records ever added
        self.on_record = on_record

    def add(self, record: ActionRecord) -> None:
        with self._lock:
            self._records.append(record)
            self.accepted += 1
        if self.on_record is not None:
            self.on_record(record)

    def recent(self, n: int = 10) -> list[ActionRecord]:
        """The newest ``n`` records, newest first."""
        with self._lock:
            return list(self._records)[::-1][:n]

    @property
    def last(self) -> ActionRecord | None:
        with self._lock:
            return self._records[-1] if self._records else None
