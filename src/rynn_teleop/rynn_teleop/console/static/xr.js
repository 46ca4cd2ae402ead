// rynn_teleop XR headset page: WebXR hand tracking in, the consumer feed and the operator's controls in the headset.
// Protocol and rules: rynn_teleop/console/server.py (same WebSocket, session secret, token and actions as the
// console page). Per XR frame one {"type": "xr_frame"} message: the head pose and the 25 joints of each tracked
// hand (core/xr.py parse_frame); an untracked head or hand is null, which the stack treats as lost tracking (hold).
import * as THREE from "./vendor/three/three.module.js";

const query = new URLSearchParams(location.search);
const token = query.get("token") || "";
// ?scale=0.5: render the headset's views at half resolution (a slow GPU, or software rendering in the tests)
const FRAMEBUFFER_SCALE = Math.min(Math.max(Number(query.get("scale")) || 1.0, 0.25), 2.0);
const session = document.querySelector('meta[name="rynn-session"]').content;
const JOINTS = [
  "wrist", "thumb-metacarpal", "thumb-phalanx-proximal", "thumb-phalanx-distal", "thumb-tip",
  ...["index", "middle", "ring", "pinky"].flatMap((f) =>
    ["metacarpal", "phalanx-proximal", "phalanx-intermediate", "phalanx-distal", "tip"].map((p) => `${f}-finger-${p}`)),
];
const SIDES = ["left", "right"];
const MAX_BUFFERED = 32 * 1024;  // [bytes] unsent WebSocket data above which XR frames are skipped (never queued)
const COUNTDOWN_S = { calibrate: 3, engage: 2 };  // [s] time to put the hands where the robot's are
const PRESS_DEPTH = 0.005, PRESS_BEHIND = 0.04, PRESS_FRONT = 0.01;  // [m] poke: touch, deepest, armed in front
const $ = (id) => document.getElementById(id);

// read by tests/test_xr_browser.py and bench/xr.py
const stats = window.rynnXR = {
  sent: 0, skipped: 0, xrFrames: 0, inXR: false, refused: [], pressed: [], actions: [], state: null,
  feed: { frames: 0, shown: [], fps: 0 }, buttons: {}, tips: { left: null, right: null },
  wrists: { left: null, right: null }, head: null, gaps: [],
};

function say(text, refused) {
  $("message").textContent = text;
  $("message").className = "message" + (refused ? " refused" : "");
  panelMessage = text;
  drawStatus();
}

// ------------------------------------------------------------------ actions (the console's HTTP API)
async function perform(action) {
  stats.actions.push({ action, t: performance.now() });
  try {
    const response = await fetch("api/action", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Rynn-Token": token, "X-Rynn-Session": session },
      body: JSON.stringify({ action, fields: {} }),
    });
    const result = await response.json();
    say(`${action}: ${result.message}`, !result.ok);
  } catch (err) {
    say(`${action}: ${err}`, true);
  }
}

let countdown = null;  // {action, until [ms]}
function request(action) {
  stats.pressed.push(action);
  if (COUNTDOWN_S[action]) {
    countdown = { action, until: performance.now() + 1000 * COUNTDOWN_S[action] };
    return;
  }
  if (action === "estop" || action === "disengage") countdown = null;  // a pending engage never follows a stop
  perform(action);
}

function tickCountdown() {
  if (!countdown) return;
  const left = (countdown.until - performance.now()) / 1000;
  if (left <= 0) {
    const { action } = countdown;
    countdown = null;
    perform(action);
  } else {
    panelMessage = `${countdown.action} in ${Math.ceil(left)} s: hands where the robot's are`;
  }
  drawStatus();
}

document.querySelectorAll("[data-action]").forEach((b) => b.addEventListener("click", () => request(b.dataset.action)));

// ------------------------------------------------------------------ WebSocket: state, feed, XR frames
let ws = null;
const feedCanvas = document.createElement("canvas");
feedCanvas.width = 640; feedCanvas.height = 480;
const feedCtx = feedCanvas.getContext("2d");
feedCtx.fillStyle = "#222"; feedCtx.fillRect(0, 0, 640, 480);
feedCtx.fillStyle = "#aaa"; feedCtx.font = "32px sans-serif"; feedCtx.fillText("waiting for the feed", 160, 240);

function connect() {
  const url = new URL("ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  if (token) url.searchParams.set("token", token);
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => {
    $("connection").textContent = "connected"; $("connection").className = "badge ok";
    ws.send(JSON.stringify({ type: "hello", session }));
    ws.send(JSON.stringify({ type: "subscribe", streams: ["consumer"] }));
  };
  ws.onclose = (ev) => {
    $("connection").textContent = `disconnected (${ev.code})`; $("connection").className = "badge error";
    if (ev.code === 4403) { say(`refused: ${ev.reason}; reload the page`, true); return; }
    setTimeout(connect, 1000);
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data === "string") {
      const msg = JSON.parse(ev.data);
      if (msg.type === "state") showState(msg);
      else if (msg.type === "xr_refused") {
        stats.refused.push(msg);
        if (stats.refused.length > 100) stats.refused.shift();
        say(`XR frame refused (${msg.reason}): ${msg.message}`, true);
      }
      return;
    }
    const view = new DataView(ev.data);
    const n = view.getUint32(0);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(ev.data, 4, n)));
    drawFeed(header, new Blob([new Uint8Array(ev.data, 4 + n)], { type: "image/jpeg" }));
  };
}

// Flow control: a frame is acknowledged as it arrives (the server sends the next one only then, so frames never
// queue here, and the next one travels while this one decodes); a frame arriving during a decode waits as the
// newest (an older waiting one is dropped). Once on the panel's texture it is acknowledged again with its times
// (the console's latency meter: ROS message received -> shown). The next render counts it as shown.
let feedPending = false, decoding = false, waiting = null;
function drawFeed(header, jpeg) {
  if (ws && ws.readyState === WebSocket.OPEN) {
    ws.send(JSON.stringify({ type: "decoded", stream: header.stream, seq: header.seq }));
  }
  waiting = { header, jpeg };
  if (!decoding) decodeNext();
}

async function decodeNext() {
  decoding = true;
  while (waiting) {
    const { header, jpeg } = waiting;
    waiting = null;
    let bitmap;
    try {
      bitmap = await createImageBitmap(jpeg, { imageOrientation: "flipY" });  // ImageBitmaps ignore flipY
    } catch (err) {
      continue;  // an undecodable frame is skipped
    }
    const old = feedTexture.image;
    if (!old || old.width !== bitmap.width || old.height !== bitmap.height) feedTexture.dispose();  // new size
    feedTexture.image = bitmap;
    feedTexture.flipY = false;
    feedTexture.needsUpdate = true;
    feedPending = true;
    if (old && old.close) old.close();  // an ImageBitmap replaced before or after its upload: not needed any more
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: "decoded", stream: header.stream, seq: header.seq,
                               received_ms: header.received_ms, t_ms: Date.now() }));
    }
  }
  decoding = false;
}

function countShown() {  // at a render: the panel shows a new feed image
  if (!feedPending) return;
  feedPending = false;
  const now = performance.now();
  stats.feed.frames += 1;
  stats.feed.shown.push(now);
  while (stats.feed.shown.length && stats.feed.shown[0] < now - 2000) stats.feed.shown.shift();
  const shown = stats.feed.shown;
  stats.feed.fps = shown.length > 1 ? (shown.length - 1) * 1000 / (shown[shown.length - 1] - shown[0]) : 0;
}

const r5 = (v) => Math.round(v * 1e5) / 1e5;  // 10 um, 1e-5 of a quaternion: a frame is about 4 kB of JSON
const pose7 = (t) => [r5(t.position.x), r5(t.position.y), r5(t.position.z),
  r5(t.orientation.x), r5(t.orientation.y), r5(t.orientation.z), r5(t.orientation.w)];

function sendFrame(seq, tMs, head, hands) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return;
  if (ws.bufferedAmount > MAX_BUFFERED) { stats.skipped += 1; return; }
  ws.send(JSON.stringify({ type: "xr_frame", seq, t_ms: tMs, head, left: hands.left, right: hands.right }));
  stats.sent += 1;
}

// ------------------------------------------------------------------ state
let lastState = null, panelMessage = "";
function showState(st) {
  lastState = stats.state = st;
  const xr = st.xr || {};
  const badge = $("xr-input");
  badge.textContent = xr.streaming ? `XR input: ${xr.client} (${xr.rate_hz} Hz)` : "XR input: none";
  badge.className = "badge " + (xr.streaming ? "ok" : "");
  const arms = Object.entries(st.arms).map(([s, a]) => `${s}: ${a.engaged ? "engaged" : "disengaged"}` +
    `${a.calibrated === false ? " (not calibrated)" : ""}`).join(", ");
  const ep = st.episode;
  const rec = !ep.running ? "no recorder" : ep.recording ? `recording ${ep.name} ${(ep.elapsed_s || 0).toFixed(0)} s` : "not recording";
  $("state").textContent = `arms: ${arms}\ne-stop: ${st.estop_latched ? "LATCHED" : "released"}\nfeed: ` +
    `${st.active_source || "?"}\nepisode: ${rec}\nXR frames: ${xr.frames}, refused: ${JSON.stringify(xr.refused)}`;
  drawStatus();
}

// ------------------------------------------------------------------ scene
const canvas = $("view");
const renderer = new THREE.WebGLRenderer({ canvas, antialias: false });
renderer.setPixelRatio(1);
renderer.setSize(640, 480, false);
renderer.xr.enabled = true;
renderer.xr.setReferenceSpaceType("local-floor");
renderer.xr.setFramebufferScaleFactor(FRAMEBUFFER_SCALE);
const scene = new THREE.Scene();
scene.background = new THREE.Color(0x1a1d22);
scene.add(new THREE.HemisphereLight(0xffffff, 0x333344, 2.0));
const camera = new THREE.PerspectiveCamera(70, 4 / 3, 0.02, 30);  // outside XR: where a head would be
camera.position.set(0, 1.6, 0);
const floor = new THREE.GridHelper(6, 12, 0x445566, 0x2a3038);
scene.add(floor);

function labelTexture(w, h, draw) {
  const c = document.createElement("canvas");
  c.width = w; c.height = h;
  draw(c.getContext("2d"), w, h);
  const t = new THREE.CanvasTexture(c);
  t.colorSpace = THREE.SRGBColorSpace;
  return t;
}

// the rig: placed in front of the operator's head when the session starts (panels at eye level)
const rig = new THREE.Group();
rig.position.set(0, 1.6, 0);
scene.add(rig);
const feedTexture = new THREE.CanvasTexture(feedCanvas);
feedTexture.colorSpace = THREE.SRGBColorSpace;
const feedPanel = new THREE.Mesh(new THREE.PlaneGeometry(1.2, 0.9), new THREE.MeshBasicMaterial({ map: feedTexture }));
feedPanel.position.set(0, 0.02, -1.3);
rig.add(feedPanel);

const statusCanvas = document.createElement("canvas");
statusCanvas.width = 1024; statusCanvas.height = 112;
const statusTexture = new THREE.CanvasTexture(statusCanvas);
statusTexture.colorSpace = THREE.SRGBColorSpace;
const statusPanel = new THREE.Mesh(new THREE.PlaneGeometry(1.2, 0.13), new THREE.MeshBasicMaterial({ map: statusTexture }));
statusPanel.position.set(0, 0.56, -1.3);
rig.add(statusPanel);

function drawStatus() {
  const g = statusCanvas.getContext("2d");
  g.fillStyle = "#101418"; g.fillRect(0, 0, 1024, 112);
  const st = lastState;
  const chips = [];  // [text, colour]
  if (!st) chips.push(["no state", "#555"]);
  else {
    for (const [side, arm] of Object.entries(st.arms)) {
      chips.push([`${side[0].toUpperCase()} ${arm.engaged ? "ENGAGED" : "free"}`, arm.engaged ? "#1f6f2a" : "#444"]);
    }
    const ep = st.episode;
    chips.push([ep.recording ? "● REC" : "rec off", ep.recording ? "#b71c1c" : "#444"]);
    chips.push([st.estop_latched ? "E-STOP LATCHED" : "e-stop released", st.estop_latched ? "#b71c1c" : "#1f6f2a"]);
    chips.push([`feed ${st.active_source || "?"}`, "#34495e"]);
  }
  let size = 30;  // [px] as large as fits in one row
  const width = () => chips.reduce((w, [text]) => w + g.measureText(text).width + 34, 16);
  g.font = `bold ${size}px sans-serif`;
  while (size > 14 && width() > 1010) { size -= 2; g.font = `bold ${size}px sans-serif`; }
  let x = 16;
  for (const [text, color] of chips) {
    const w = g.measureText(text).width + 24;
    g.fillStyle = color; g.fillRect(x, 8, w, 44);
    g.fillStyle = "#fff"; g.fillText(text, x + 12, 30 + size / 3);
    x += w + 10;
  }
  g.font = "26px sans-serif"; g.fillStyle = "#ddd";
  g.fillText(panelMessage.slice(0, 70), 16, 94);
  statusTexture.needsUpdate = true;
}
drawStatus();

// controls: a strip below the feed, within reach, tilted towards the eyes; its face is +z of each button
const strip = new THREE.Group();
strip.position.set(0, -0.3, -0.42);
strip.rotation.x = -0.6;
rig.add(strip);
const BUTTONS = [
  // [action, label, x, y, width, height, colour] in the strip's plane [m]
  ["estop", "E-STOP", 0.0, 0.085, 0.16, 0.07, "#c62828"],
  ["calibrate", "CALIBRATE", -0.285, 0.0, 0.085, 0.05, "#37474f"],
  ["engage", "ENGAGE", -0.19, 0.0, 0.085, 0.05, "#2e7d32"],
  ["disengage", "DISENGAGE", -0.095, 0.0, 0.085, 0.05, "#6d4c41"],
  ["feed toggle", "FEED", 0.0, 0.0, 0.085, 0.05, "#34495e"],
  ["episode start", "REC START", 0.095, 0.0, 0.085, 0.05, "#8e2424"],
  ["episode stop", "REC STOP", 0.19, 0.0, 0.085, 0.05, "#5d4037"],
  ["reset", "RESET", 0.285, 0.0, 0.085, 0.05, "#455a64"],
];
const buttons = BUTTONS.map(([action, label, x, y, w, h, color]) => {
  const map = labelTexture(256, Math.round(256 * h / w), (g, W, H) => {
    g.fillStyle = color; g.fillRect(0, 0, W, H);
    g.strokeStyle = "#fff"; g.lineWidth = 6; g.strokeRect(3, 3, W - 6, H - 6);
    let size = Math.round(H * 0.4);
    g.font = `bold ${size}px sans-serif`;
    while (size > 10 && g.measureText(label).width > W * 0.86) { size -= 2; g.font = `bold ${size}px sans-serif`; }
    g.fillStyle = "#fff"; g.textAlign = "center"; g.textBaseline = "middle"; g.fillText(label, W / 2, H / 2);
  });
  const mesh = new THREE.Mesh(new THREE.PlaneGeometry(w, h), new THREE.MeshBasicMaterial({ map }));
  mesh.position.set(x, y, 0);
  strip.add(mesh);
  return { action, mesh, w, h, armed: { left: false, right: false }, flash: 0 };
});

function publishButtons() {
  scene.updateMatrixWorld(true);
  for (const b of buttons) {
    const c = new THREE.Vector3().setFromMatrixPosition(b.mesh.matrixWorld);
    const n = new THREE.Vector3(0, 0, 1).transformDirection(b.mesh.matrixWorld);
    stats.buttons[b.action] = { center: [c.x, c.y, c.z], normal: [n.x, n.y, n.z], size: [b.w, b.h] };
  }
}
publishButtons();

// hands: a sphere per joint
const handMeshes = {};
for (const side of SIDES) {
  const m = new THREE.InstancedMesh(new THREE.SphereGeometry(0.008, 8, 6),
    new THREE.MeshStandardMaterial({ color: side === "left" ? 0x64b5f6 : 0xffb74d }), JOINTS.length);
  m.visible = false;
  scene.add(m);
  handMeshes[side] = m;
}

const local = new THREE.Vector3(), inverse = new THREE.Matrix4();
function poke(side, tip) {
  for (const b of buttons) {
    inverse.copy(b.mesh.matrixWorld).invert();
    local.set(tip[0], tip[1], tip[2]).applyMatrix4(inverse);
    const inside = Math.abs(local.x) <= b.w / 2 && Math.abs(local.y) <= b.h / 2;
    if (!inside || local.z > PRESS_FRONT) { b.armed[side] = inside; continue; }
    if (b.armed[side] && local.z <= PRESS_DEPTH && local.z >= -PRESS_BEHIND) {
      b.armed[side] = false;  // once per touch: re-armed when the tip is back in front
      b.flash = performance.now();
      request(b.action);
    }
  }
}

// ------------------------------------------------------------------ the XR session
let xrSession = null, refSpace = null, placed = false, seq = 0;
const matrix = new THREE.Matrix4(), quat = new THREE.Quaternion(), pos = new THREE.Vector3(), scale = new THREE.Vector3();

let lastFrameTime = null;
function onXRFrame(time, frame) {
  stats.xrFrames += 1;
  if (lastFrameTime !== null) {
    stats.gaps.push(time - lastFrameTime);  // [ms] between XR frames (the tests and the bench read them)
    if (stats.gaps.length > 600) stats.gaps.shift();
  }
  lastFrameTime = time;
  const viewer = frame.getViewerPose(refSpace);
  const head = viewer ? pose7(viewer.transform) : null;
  stats.head = head;
  if (viewer && !placed) {  // the panels in front of the head, level, at eye height
    const o = viewer.transform.orientation;
    const yaw = new THREE.Euler().setFromQuaternion(new THREE.Quaternion(o.x, o.y, o.z, o.w), "YXZ").y;
    rig.position.set(viewer.transform.position.x, viewer.transform.position.y, viewer.transform.position.z);
    rig.rotation.set(0, yaw, 0);
    placed = true;
    publishButtons();
  }
  const hands = { left: null, right: null };
  for (const source of frame.session.inputSources) {
    if (!source.hand || !SIDES.includes(source.handedness)) continue;
    const joints = [];
    for (const name of JOINTS) {
      const jp = frame.getJointPose(source.hand.get(name), refSpace);
      if (!jp) break;
      joints.push(pose7(jp.transform));
    }
    if (joints.length === JOINTS.length) hands[source.handedness] = joints;
  }
  sendFrame(seq++, performance.timeOrigin + time, head, hands);
  for (const side of SIDES) {
    const joints = hands[side], mesh = handMeshes[side];
    mesh.visible = joints !== null;
    stats.tips[side] = joints ? joints[9].slice(0, 3) : null;
    stats.wrists[side] = joints ? joints[0] : null;
    if (!joints) { for (const b of buttons) b.armed[side] = false; continue; }
    joints.forEach((j, i) => {
      matrix.compose(pos.set(j[0], j[1], j[2]), quat.set(j[3], j[4], j[5], j[6]), scale.set(1, 1, 1));
      mesh.setMatrixAt(i, matrix);
    });
    mesh.instanceMatrix.needsUpdate = true;
    poke(side, joints[9]);
  }
}

function render(time, frame) {
  tickCountdown();
  const now = performance.now();
  for (const b of buttons) b.mesh.scale.setScalar(now - b.flash < 200 ? 0.9 : 1.0);  // a press shows
  if (frame && refSpace) onXRFrame(time, frame);
  countShown();
  renderer.render(scene, camera);
}
renderer.setAnimationLoop(render);

async function enterXR() {
  try {
    const s = await navigator.xr.requestSession("immersive-vr", {
      requiredFeatures: ["hand-tracking"], optionalFeatures: ["local-floor"],
    });
    xrSession = s;
    await renderer.xr.setSession(s);
    refSpace = renderer.xr.getReferenceSpace();
    placed = false;
    stats.inXR = true;
    s.addEventListener("end", () => {
      xrSession = null; refSpace = null; stats.inXR = false;
      for (const side of SIDES) handMeshes[side].visible = false;
      $("enter").textContent = "Enter XR";
    });
    $("enter").textContent = "Exit XR";
    say("in XR: hands tracked are streamed");
  } catch (err) {
    say(`cannot enter XR: ${err}`, true);
  }
}

$("enter").addEventListener("click", () => (xrSession ? xrSession.end() : enterXR()));

async function checkSupport() {
  const support = $("xr-support");
  if (!window.isSecureContext) {
    support.textContent = "not a secure context: open the https:// address (or http://localhost)";
    support.className = "badge error";
    return;
  }
  if (!navigator.xr) { support.textContent = "this browser has no WebXR"; support.className = "badge error"; return; }
  const ok = await navigator.xr.isSessionSupported("immersive-vr").catch(() => false);
  support.textContent = ok ? "WebXR ready" : "immersive-vr not supported here";
  support.className = "badge " + (ok ? "ok" : "error");
  $("enter").disabled = !ok;
}

checkSupport();
connect();
