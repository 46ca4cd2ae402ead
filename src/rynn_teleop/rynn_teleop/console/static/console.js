// rynn_teleop operator console: live video over one WebSocket, state, controls, keyboard shortcuts.
// Protocol: see rynn_teleop/console/server.py.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
// this run's session secret, carried by the page (never in a URL): actions send it in a header, the WebSocket in
// its first message; a page of another origin cannot read it
const session = document.querySelector('meta[name="rynn-session"]').content;
const STREAMS = ["consumer", "physical", "generated"];
const KEYS = {
  " ": "estop", "Escape": "estop", "r": "reset", "c": "calibrate", "e": "engage", "d": "disengage",
  "p": "feed physical", "g": "feed generated", "t": "feed toggle", "s": "episode start",
  "k": "episode stop", "x": "episode discard",
};
const views = {};
for (const s of STREAMS) {
  const canvas = document.getElementById("view-" + s);
  views[s] = { canvas, ctx: canvas.getContext("2d"), info: document.getElementById("info-" + s),
               shown: [], busy: false, latencies: [] };
}
const $ = (id) => document.getElementById(id);
let lastState = null;
// per stream, the newest drawn frames: {seq, stamp_ns, received_ms, drawn_ms} (read by bench/console.py)
window.consoleStats = { consumer: [], physical: [], generated: [] };

function say(text, refused) {
  const m = $("message");
  m.textContent = text;
  m.className = "message" + (refused ? " refused" : "");
}

function fieldsFor(action) {
  if (action === "episode start") return { task: $("task").value, operator: $("operator").value };
  if (action === "episode stop") return { outcome: $("outcome").value, notes: $("notes").value };
  return {};
}

async function perform(action) {
  const buttons = document.querySelectorAll(`[data-action="${action}"]`);
  buttons.forEach((b) => b.classList.add("busy"));
  try {
    const response = await fetch("api/action", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Rynn-Token": token, "X-Rynn-Session": session },
      body: JSON.stringify({ action, fields: fieldsFor(action) }),
    });
    const result = await response.json();
    say(`${action}: ${result.message}`, !result.ok);
    if (result.ok && action === "episode stop") { $("outcome").value = ""; $("notes").value = ""; }
  } catch (err) {
    say(`${action}: ${err}`, true);
  } finally {
    buttons.forEach((b) => b.classList.remove("busy"));
  }
}

document.querySelectorAll("[data-action]").forEach((b) =>
  b.addEventListener("click", () => perform(b.dataset.action)));

document.addEventListener("keydown", (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
  if (typing && ev.key !== "Escape") return;  // letters and Space type text; Esc always stops
  const action = KEYS[ev.key.length === 1 ? ev.key.toLowerCase() : ev.key];
  if (!action) return;
  ev.preventDefault();
  if (typing) document.activeElement.blur();
  perform(action);
});

// ------------------------------------------------------------------ state
function cell(value) {
  const word = value === true ? "yes" : value === false ? "no" : "unknown";
  return `<td class="${word}">${word}</td>`;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

function showState(st) {
  lastState = st;
  let rows = "<tr><th></th><th>calibrated</th><th>engaged</th><th>following</th></tr>";
  for (const [side, arm] of Object.entries(st.arms)) {
    rows += `<tr><th>${side}</th>${cell(arm.calibrated)}${cell(arm.engaged)}${cell(arm.following)}</tr>`;
  }
  $("arms").innerHTML = rows;
  showDrivers(st.drivers);
  const estop = $("estop-state");
  const drivers = Object.entries(st.estop).filter(([, v]) => v !== null);
  estop.textContent = drivers.length === 0 ? "e-stop: no driver" :
    (st.estop_latched ? "E-STOP LATCHED" : "e-stop: released");
  estop.className = "badge " + (drivers.length === 0 ? "stale" : st.estop_latched ? "latched" : "ok");
  estop.dataset.latched = String(st.estop_latched);
  $("active-source").textContent = st.active_source || "?";
  const ep = st.episode;
  const epState = $("episode-state");
  if (!ep.running) { epState.textContent = "no recorder"; epState.className = "badge stale"; $("episode").textContent = ""; }
  else if (ep.recording) {
    epState.textContent = "recording"; epState.className = "badge latched";
    const problems = ep.problems.length ? ep.problems.join("; ") : "none";
    $("episode").innerHTML = `<b>${escapeHtml(ep.name)}</b>: ${(ep.elapsed_s || 0).toFixed(1)} s, ${ep.messages} messages; ` +
      `problems so far: ${escapeHtml(problems)}`;
  } else {
    epState.textContent = "idle"; epState.className = "badge ok";
    $("episode").textContent = `episodes go to ${ep.output_dir}`;
  }
  showTwin(st.twin);
  showPolicy(st.policy);
  let nodes = "<tr><th>node</th><th>state</th><th>meters (Hz / nominal, latency p50 / p99 ms)</th></tr>";
  for (const n of st.nodes) {
    const meters = n.meters.map((m) => {
      const rate = m.rate_hz === null ? "?" : m.rate_hz.toFixed(1);
      const nominal = m.nominal_hz === null ? "" : ` / ${m.nominal_hz}`;
      const budget = m.latency_budget_ms === null ? "" : ` (budget ${m.latency_budget_ms})`;
      const lat = m.latency_p99_ms === null ? "" :
        `, ${m.latency_p50_ms.toFixed(1)} / ${m.latency_p99_ms.toFixed(1)} ms${budget}`;
      return `<span class="${m.slow || m.late ? "slow" : ""}">${escapeHtml(m.name)} ${rate}${nominal}${lat}</span>`;
    }).join("<br>");
    nodes += `<tr><td>${escapeHtml(n.name)}</td><td><span class="badge ${n.level}">${n.level}</span> ` +
      `${escapeHtml(n.message)}</td><td>${meters}</td></tr>`;
  }
  $("nodes").innerHTML = nodes;
  if (st.access) showAccess(st.access);
  for (const s of STREAMS) {
    const info = st.streams[s];
    const v = views[s];
    const fps = shownRate(v);
    v.info.textContent = info.age_ms === null ? "no frames" :
      `${info.rate_hz} Hz received, ${fps.toFixed(1)} fps shown, age ${info.age_ms} ms`;
  }
}

// the physical twin (digital mode): its scene and the task's outcome as the physics judges it
const OUTCOME_BADGE = { success: "ok", failure: "error", undecided: "warn" };

function showTwin(twin) {
  const badge = $("twin-state");
  const running = Boolean(twin && twin.running);
  document.querySelectorAll('[data-action="twin reset"]').forEach((b) => { b.disabled = !running; });
  if (!running) {
    badge.textContent = "no twin"; badge.className = "badge stale"; badge.dataset.outcome = "";
    $("twin").textContent = "";
    return;
  }
  badge.textContent = twin.outcome; badge.className = "badge " + (OUTCOME_BADGE[twin.outcome] || "warn");
  badge.dataset.outcome = twin.outcome;
  $("twin").innerHTML = `<b>${escapeHtml(twin.scene)}</b> (seed ${twin.seed}): ${escapeHtml(twin.task)}; ` +
    `${escapeHtml(twin.reason)}`;
}

// the policy node (run --policy): its state, rate against its frame rate, inference time, start / stop
const POLICY_BADGE = { idle: "ok", running: "latched", holding: "warn", estopped: "error", error: "error" };

function showPolicy(policy) {
  const badge = $("policy-state");
  const running = Boolean(policy && policy.running);
  document.querySelectorAll('[data-action^="policy "]').forEach((b) => { b.disabled = !running; });
  if (!running) {
    badge.textContent = "no policy"; badge.className = "badge stale"; badge.dataset.state = "";
    $("policy").textContent = "";
    return;
  }
  badge.textContent = policy.state; badge.className = "badge " + (POLICY_BADGE[policy.state] || "warn");
  badge.dataset.state = policy.state;
  const rate = policy.rate_hz === null ? "?" : policy.rate_hz.toFixed(1);
  const timing = policy.inference_p50_ms === null ? "" :
    `, act() ${policy.inference_p50_ms.toFixed(1)} / ${policy.inference_p99_ms.toFixed(1)} ms (p50 / p99)`;
  let text = `<b>${escapeHtml(policy.backend)}</b>: ${escapeHtml(policy.source)}<br>` +
    `run ${policy.run}, ${policy.steps} steps, ${rate} / ${policy.fps} Hz${timing}, ${policy.overruns} overruns` +
    (policy.recording ? ", recorded" : "");
  if (policy.reason) text += `<br>${escapeHtml(policy.reason)}`;
  if (policy.last_error) text += `<br>last error: ${escapeHtml(policy.last_error)}`;
  $("policy").innerHTML = text;
}

// each driver's lifecycle state (only an active driver commands its joints) and its safety mode
const LIFECYCLE_BADGE = { active: "ok", inactive: "warn", unconfigured: "stale", finalized: "stale" };

function showDrivers(drivers) {
  let rows = "<tr><th>driver</th><th>backend</th><th>lifecycle</th><th>mode</th></tr>";
  for (const [name, d] of Object.entries(drivers)) {
    if (d === null) {
      rows += `<tr data-driver="${escapeHtml(name)}" data-lifecycle=""><td>${escapeHtml(name)}</td>` +
        `<td colspan="3" class="unknown">not running</td></tr>`;
      continue;
    }
    const badge = d.lifecycle_error ? "error" : (LIFECYCLE_BADGE[d.lifecycle] || "warn");
    const why = d.lifecycle_error ? ` ${escapeHtml(d.lifecycle_error)}` : "";
    rows += `<tr data-driver="${escapeHtml(name)}" data-lifecycle="${escapeHtml(d.lifecycle)}">` +
      `<td>${escapeHtml(name)}</td><td>${escapeHtml(d.backend)}</td>` +
      `<td><span class="badge ${badge}">${escapeHtml(d.lifecycle)}</span>${why}</td><td>${escapeHtml(d.mode)}</td></tr>`;
  }
  $("drivers").innerHTML = rows;
}

// refusals per reason (requests and WebSockets the console turned away) and the newest accepted actions
function showAccess(access) {
  const refused = Object.entries(access.refused).filter(([, n]) => n > 0);
  const badge = $("refused-state");
  badge.textContent = refused.length ? "refused: " + refused.map(([r, n]) => `${r} ${n}`).join(", ") : "no refusals";
  badge.className = "badge " + (refused.length ? "warn" : "ok");
  badge.dataset.refused = JSON.stringify(access.refused);
  const last = access.last_refused;
  $("refused").textContent = last ?
    `last refused ${new Date(last.time * 1000).toLocaleTimeString()} (${last.reason}, ${last.client}): ${last.message}` : "";
  let rows = "<tr><th>time</th><th>client</th><th>action</th><th>result</th></tr>";
  for (const a of access.log) {
    const who = a.origin ? `${a.client} (${a.origin})` : `${a.client} (no Origin)`;
    rows += `<tr><td>${new Date(a.t * 1000).toLocaleTimeString()}</td><td>${escapeHtml(who)}</td>` +
      `<td>${escapeHtml(a.action)}</td><td class="${a.ok ? "yes" : "no"}">${a.status} ${escapeHtml(a.result)}</td></tr>`;
  }
  $("action-log").innerHTML = rows;
}

function shownRate(v) {
  const now = performance.now();
  v.shown = v.shown.filter((t) => t > now - 2000);
  return v.shown.length > 1 ? (v.shown.length - 1) * 1000 / (v.shown[v.shown.length - 1] - v.shown[0]) : 0;
}

// ------------------------------------------------------------------ video
let ws = null;

function connect() {
  const url = new URL("ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  if (token) url.searchParams.set("token", token);
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => {
    $("connection").textContent = "connected"; $("connection").className = "badge ok";
    ws.send(JSON.stringify({ type: "hello", session }));  // first: the console sends nothing before it
    ws.send(JSON.stringify({ type: "subscribe", streams: STREAMS }));
  };
  ws.onclose = (ev) => {
    $("connection").textContent = "disconnected"; $("connection").className = "badge error";
    if (ev.code === 4403) {  // a console restarted since this page was loaded has another secret
      say(`refused: ${ev.reason}; reload the page`, true);
      return;
    }
    setTimeout(connect, 1000);
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data === "string") {
      const msg = JSON.parse(ev.data);
      if (msg.type === "state") showState(msg);
      return;
    }
    const view = new DataView(ev.data);
    const headerLength = view.getUint32(0);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(ev.data, 4, headerLength)));
    const jpeg = new Blob([new Uint8Array(ev.data, 4 + headerLength)], { type: "image/jpeg" });
    draw(header, jpeg);
  };
}

// Each frame is acknowledged once drawn (or found undrawable): the server sends a stream's next frame only then,
// so frames never queue in a slow browser ahead of the state messages.
async function draw(header, jpeg) {
  const v = views[header.stream];
  const ack = { type: "decoded", stream: header.stream, seq: header.seq };
  try {
    if (!v) return;
    const bitmap = await createImageBitmap(jpeg);
    if (v.canvas.width !== bitmap.width || v.canvas.height !== bitmap.height) {
      v.canvas.width = bitmap.width; v.canvas.height = bitmap.height;
    }
    v.ctx.drawImage(bitmap, 0, 0);
    bitmap.close();
    const t = Date.now();
    v.shown.push(performance.now());
    v.latencies.push(t - header.received_ms);
    if (v.latencies.length > 200) v.latencies.shift();
    v.canvas.dataset.seq = String(header.seq);
    const stats = window.consoleStats[header.stream];
    stats.push({ seq: header.seq, stamp_ns: header.stamp_ns, received_ms: header.received_ms, drawn_ms: t });
    if (stats.length > 5000) stats.shift();
    ack.received_ms = header.received_ms;
    ack.t_ms = t;
  } finally {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(ack));
  }
}

setInterval(() => {
  const parts = STREAMS.map((s) => {
    const lat = [...views[s].latencies].sort((a, b) => a - b);
    const p50 = lat.length ? lat[Math.floor(lat.length / 2)].toFixed(0) : "-";
    return `${s} ${shownRate(views[s]).toFixed(1)} fps, ROS to screen p50 ${p50} ms`;
  });
  $("browser-stats").textContent = "This browser: " + parts.join("; ");
}, 1000);

connect();
