#!/usr/bin/env node
// A Foxglove WebSocket protocol client for tests/test_foxglove_node.py, built from what the Foxglove app
// itself uses: the `@foxglove/ws-protocol` client (over the `ws` WebSocket implementation) and, for channels
// with a "ros2msg" schema, `@foxglove/rosmsg` + `@foxglove/rosmsg2-serialization` to decode the CDR data.
//
// Usage:
//   node client.js --url ws://127.0.0.1:8765 --want /joint_states=20 [--want TOPIC=N ...]
//                  [--timeout 20] [--pause S] [--quiet S] [--no-data] [--subprotocol NAME ...]
//
//   --want TOPIC=N  subscribe to TOPIC once it is advertised; done when N messages of every wanted topic came
//   --timeout S     give up after S seconds (exit code 1)
//   --pause S       stop reading the socket for S seconds right after the first subscription (a slow client:
//                   TCP backpressure reaches the server), then read again
//   --quiet S       also done when no message came for S seconds (after any pause)
//   --no-data       leave the payload out of the message lines (only its length, head and decoded summary)
//   --subprotocol   the WebSocket subprotocol(s) offered (repeatable); default, as the Foxglove app offers them:
//                   "foxglove.sdk.v1" (what foxglove-sdk servers and foxglove_bridge >= 3 accept) and
//                   "foxglove.websocket.v1" (the same protocol under its older name: ws-protocol servers)
//
// Prints one JSON object per line on stdout, `event` first:
//   open {protocol}                      the negotiated WebSocket subprotocol
//   serverInfo {name, capabilities, supportedEncodings}
//   advertise {channels: [{id, topic, encoding, schemaName, schemaEncoding, schema}]}
//   subscribed {topic, channelId, subscriptionId}
//   message {topic, timestamp (ns, string), length, head_hex, data_b64?, decoded?, trailing?, decode_error?}
//   paused {} / resumed {}
//   done {reason: "complete" | "quiet" | "timeout" | "closed", counts: {topic: n}}
//   error {message}
// Exit code: 0 when done by "complete" or "quiet", 1 otherwise.
"use strict";

const { FoxgloveClient } = require("@foxglove/ws-protocol");
const { parse: parseDefinition } = require("@foxglove/rosmsg");
const { MessageReader } = require("@foxglove/rosmsg2-serialization");
const WebSocket = require("ws");

const SUBPROTOCOLS = ["foxglove.sdk.v1", FoxgloveClient.SUPPORTED_SUBPROTOCOL];

function parseArgs(argv) {
  const args = { url: "", want: new Map(), timeout: 20, pause: 0, quiet: 0, data: true, subprotocols: [] };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${key} needs a value`);
      return argv[++i];
    };
    if (key === "--url") args.url = value();
    else if (key === "--want") {
      const entry = value();
      const at = entry.lastIndexOf("=");
      const count = Number(entry.slice(at + 1));
      if (at <= 0 || !Number.isInteger(count) || count < 1) throw new Error(`--want TOPIC=N, got ${entry}`);
      args.want.set(entry.slice(0, at), count);
    } else if (key === "--timeout") args.timeout = Number(value());
    else if (key === "--pause") args.pause = Number(value());
    else if (key === "--quiet") args.quiet = Number(value());
    else if (key === "--no-data") args.data = false;
    else if (key === "--subprotocol") args.subprotocols.push(value());
    else throw new Error(`unknown argument ${key}`);
  }
  if (!args.url || args.want.size === 0) throw new Error("--url and at least one --want are required");
  if (args.subprotocols.length === 0) args.subprotocols = SUBPROTOCOLS;
  return args;
}

function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, ...fields }, jsonValue) + "\n");
}

// JSON for decoded ROS messages: int64 as strings, short typed arrays as lists, long ones summarized.
function jsonValue(_key, value) {
  if (typeof value === "bigint") return value.toString();
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    const list = (view) => Array.from(view, (v) => (typeof v === "bigint" ? v.toString() : v));
    return value.length <= 64 ? list(value) : { length: value.length, head: list(value.subarray(0, 16)) };
  }
  return value;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const counts = Object.fromEntries([...args.want.keys()].map((t) => [t, 0]));
  const bySubscription = new Map(); // subscription id -> {topic, reader}
  const subscribedTopics = new Set();
  let finished = false;
  let paused = false;
  let quietSince = null; // since when no message came (null: none yet, or paused)

  const ws = new WebSocket(args.url, args.subprotocols);
  const client = new FoxgloveClient({ ws });

  const finish = (reason) => {
    if (finished) return;
    finished = true;
    emit("done", { reason, counts });
    process.exitCode = reason === "complete" || reason === "quiet" ? 0 : 1;
    clearInterval(ticker);
    clearTimeout(deadline);
    client.close();
    setTimeout(() => process.exit(), 500).unref();
  };
  const complete = () => [...args.want].every(([topic, n]) => counts[topic] >= n);

  client.on("open", () => emit("open", { protocol: ws.protocol }));
  client.on("error", (err) => emit("error", { message: String(err && err.message ? err.message : err) }));
  client.on("close", () => finish(complete() ? "complete" : "closed"));
  client.on("serverInfo", (info) =>
    emit("serverInfo", {
      name: info.name,
      capabilities: info.capabilities,
      supportedEncodings: info.supportedEncodings ?? [],
    }),
  );
  client.on("advertise", (channels) => {
    emit("advertise", {
      channels: channels.map((c) => ({
        id: c.id,
        topic: c.topic,
        encoding: c.encoding,
        schemaName: c.schemaName,
        schemaEncoding: c.schemaEncoding,
        schema: c.schema,
      })),
    });
    for (const channel of channels) {
      if (!args.want.has(channel.topic) || subscribedTopics.has(channel.topic)) continue;
      let reader;
      if (channel.encoding === "cdr" && channel.schemaEncoding === "ros2msg") {
        try {
          reader = new MessageReader(parseDefinition(channel.schema, { ros2: true }));
        } catch (err) {
          emit("error", { message: `${channel.topic}: schema does not parse: ${err.message}` });
        }
      }
      const subscriptionId = client.subscribe(channel.id);
      subscribedTopics.add(channel.topic);
      bySubscription.set(subscriptionId, { topic: channel.topic, reader });
      emit("subscribed", { topic: channel.topic, channelId: channel.id, subscriptionId });
      if (args.pause > 0 && !paused) {
        paused = true;
        setImmediate(() => {
          ws.pause(); // no more reads from the socket: the kernel buffers fill, then the server's send blocks
          quietSince = null;
          emit("paused", {});
          setTimeout(() => {
            quietSince = Date.now();
            ws.resume();
            emit("resumed", {});
          }, args.pause * 1000);
        });
      }
    }
  });
  client.on("message", ({ subscriptionId, timestamp, data }) => {
    const sub = bySubscription.get(subscriptionId);
    if (sub === undefined || finished) return;
    if (!ws.isPaused) quietSince = Date.now();
    const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    const line = {
      topic: sub.topic,
      timestamp: timestamp.toString(),
      length: bytes.length,
      head_hex: bytes.subarray(0, 16).toString("hex"),
    };
    if (args.data) line.data_b64 = bytes.toString("base64");
    if (sub.reader !== undefined) {
      try {
        line.decoded = sub.reader.readMessage(bytes);
        line.trailing = sub.reader.lastReadHadTrailingBytes();
      } catch (err) {
        line.decode_error = err.message;
      }
    }
    emit("message", line);
    counts[sub.topic] += 1;
    if (complete()) finish("complete");
  });

  const ticker = setInterval(() => {
    if (args.quiet > 0 && quietSince !== null && Date.now() - quietSince > args.quiet * 1000) finish("quiet");
  }, 50);
  const deadline = setTimeout(() => finish("timeout"), args.timeout * 1000);
}

try {
  main();
} catch (err) {
  emit("error", { message: err.message });
  process.exit(2);
}
