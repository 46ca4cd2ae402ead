"""Another page in the operator's browser cannot move the robot (issue 36), in a real browser (headless Debian
chromium driven by Playwright) against a running digital stack (``rynn-teleop demo --interactive``).

An attacker page, served by the test on another local port, tries what any web page can: no-cors POSTs of
engage and reset (``text/plain``, a "simple" request that needs no preflight), a form POST, a WebSocket to
``/ws``, and requests through a DNS-rebinding name (chromium's ``--host-resolver-rules`` maps ``rebind.test`` to
127.0.0.1, so the console receives ``Host: rebind.test:<port>``, as after a rebinding). The e-stop stays latched,
the arms stay disengaged and still, and the console's refusal counters show every attempt (diagnostics, state,
and the operator's page).
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from ros_helpers import wait_for
from test_console_browser import BROWSER_ARGS, CHROMIUM, console, playwright  # noqa: F401 - console: the fixture

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install chromium")
REBIND_NAME = "rebind.test"
ATTACK_PAGE = """<!DOCTYPE html><html><body><h1>cute cats</h1>
<iframe name="sink" style="display:none"></iframe>
<form id="form" method="POST" action="http://127.0.0.1:PORT/api/action" enctype="text/plain" target="sink">
<input name='{"action": "engage", "x": "' value='"}'></form>
<script>
const console_ = "http://127.0.0.1:PORT";
const rebound = "http://REBIND:PORT";
window.results = {};
const simple = (body) => ({ method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" },
                            body: JSON.stringify(body) });
const outcome = (p) => p.then((r) => "answered " + r.type + " " + r.status, (e) => "failed " + e);
async function attack() {
  results.engage = await outcome(fetch(console_ + "/api/action", simple({ action: "engage" })));
  results.reset = await outcome(fetch(console_ + "/api/action", simple({ action: "reset" })));
  document.getElementById("form").submit();
  results.websocket = await new Promise((resolve) => {
    const ws = new WebSocket("ws://127.0.0.1:PORT/ws");
    ws.onopen = () => { ws.send(JSON.stringify({ type: "hello", session: "guess" })); };
    ws.onmessage = (ev) => resolve("message " + String(ev.data).slice(0, 40));
    ws.onclose = (ev) => resolve("closed " + ev.code);
  });
  results.rebound_state = await outcome(fetch(rebound + "/api/state"));
  results.rebound_reset = await outcome(fetch(rebound + "/api/action", simple({ action: "reset" })));
  window.done = true;
}
attack();
</script></body></html>"""
#: refusals the attack page causes, per reason: two no-cors POSTs, the form and the WebSocket come from its
#: origin; the two requests through the rebinding name carry a Host the console does not serve
EXPECTED = {"origin": 4, "host": 2}


class AttackerSite:
    """The attacker's web server: one page, on a free local port (another origin than the console's)."""

    def __init__(self, console_port: int) -> None:
        page = ATTACK_PAGE.replace("PORT", str(console_port)).replace("REBIND", REBIND_NAME).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _state(base: str) -> dict:
    return json.loads(_get(base + "api/state"))


def _act(base: str, secret: str, action: str) -> tuple[int, dict]:
    """What a script on this machine (curl) sends: the page's secret, a JSON body, no Origin."""
    request = urllib.request.Request(base + "api/action", data=json.dumps({"action": action}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-Rynn-Session": secret})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _engaged(state: dict) -> list:
    return [arm["engaged"] for arm in state["arms"].values()]


def test_an_attacker_page_changes_nothing_and_every_attempt_is_counted(console):  # noqa: F811 - the fixture
    url, out, watcher = console
    port = int(re.search(r":(\d+)/", url).group(1))
    # the stack runs: the synthetic operator engaged the arms, the drivers are released
    assert wait_for(lambda: _engaged(_state(url)) == [True, True] and watcher.released(), 90.0), _state(url)["arms"]
    # the operator stops: disengage and e-stop, as a script on this machine does it (the secret from the page)
    secret = re.search(r'<meta name="rynn-session" content="([^"]+)">', _get(url)).group(1)
    assert _act(url, secret, "disengage")[0] == 200
    assert _act(url, secret, "estop")[0] == 200
    assert wait_for(lambda: watcher.latched() and _engaged(_state(url)) == [False, False], 20.0)
    before = _state(url)["access"]["refused"]

    site = AttackerSite(port)
    try:
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM,
                                         args=[*BROWSER_ARGS, f"--host-resolver-rules=MAP {REBIND_NAME} 127.0.0.1"])
            attacker = browser.new_page()
            attacker.goto(site.url)
            assert wait_for(lambda: attacker.evaluate("window.done === true"), 30.0), attacker.evaluate("results")
            results = attacker.evaluate("results")

            def refused_now() -> dict:
                after = _state(url)["access"]["refused"]
                return {r: after[r] - before[r] for r in after if after[r] != before[r]}

            assert wait_for(lambda: refused_now() == EXPECTED, 20.0), (refused_now(), results)
            time.sleep(2.0)  # anything that got through would have acted by now
            assert refused_now() == EXPECTED, (refused_now(), results)
            assert results["websocket"].startswith("closed"), results  # never a state message
            assert results["rebound_state"].startswith("failed"), results  # nothing read through the rebound name
            # nothing changed: latched, disengaged, still
            assert watcher.latched()
            state = _state(url)
            assert state["estop_latched"] is True and _engaged(state) == [False, False]
            assert watcher.arm_motion(1.0) < 1e-6
            assert [a["action"] for a in state["access"]["log"][:2]] == ["estop", "disengage"]  # only the operator's
            # the operator's own page shows the refusals
            page = browser.new_page()
            page.goto(url)
            assert wait_for(lambda: "origin 4" in page.inner_text("#refused-state")
                            and "host 2" in page.inner_text("#refused-state"), 20.0), page.inner_text("#refused-state")
            browser.close()
    finally:
        site.close()
    # the console node's diagnostics count them as well (published once a second)
    assert wait_for(lambda: int(watcher.values_of("console").get("refused.origin", -1)) == before["origin"] + 4, 10.0)
    assert int(watcher.values_of("console")["refused.host"]) == before["host"] + 2

    # accountability: the actions taken while an episode records are in the episode (the console's /diagnostics)
    assert _act(url, secret, "episode start")[0] == 200
    assert _act(url, secret, "feed toggle")[0] == 200
    time.sleep(1.0)  # its diagnostics message reaches the recorder before the stop
    assert _act(url, secret, "episode stop")[0] == 200
    episodes = sorted(Path(out).glob("episode_*/episode.yaml"))
    assert episodes, f"no episode under {out}"
    start_s = yaml.safe_load(episodes[-1].read_text())["start_ns"] * 1e-9
    recorded = [a for a in _recorded_actions(episodes[-1].parent) if a["t"] >= start_s]  # the 1 Hz status repeats
    assert [a["action"] for a in recorded] == ["episode start", "feed toggle"], recorded
    assert all(a["client"] == "127.0.0.1" and a["ok"] and a["origin"] == "" for a in recorded), recorded


def _recorded_actions(episode: Path) -> list[dict]:
    """The console's action records in an episode's /diagnostics (``action.last`` of its status: published once
    per action, and repeated in the 1 Hz status), once each, in order."""
    from rosbags.rosbag2 import Reader

    from rynn_teleop.recording.writer import default_typestore

    store, records = default_typestore(), {}
    with Reader(episode) as reader:
        connections = [c for c in reader.connections if c.topic == "/diagnostics"]
        for connection, _, data in reader.messages(connections=connections):
            for status in store.deserialize_cdr(data, connection.msgtype).status:
                for kv in status.values if status.name == "console" else ():
                    if kv.key == "action.last":
                        record = json.loads(kv.value)
                        records[record["t"], record["action"]] = record
    return [records[k] for k in sorted(records)]
