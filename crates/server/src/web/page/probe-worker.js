// bloatlab's latency probes, in a Worker so that the page's drawing and load never delay their
// timing: WebSockets on the server's probe port, one numbered message per interval, each
// answer timed with performance.now() and passed on with the server's own view of the path.
// The probes take turns over CONNECTIONS sockets, each sent on one with no probe in flight
// where there is one: a WebSocket is TCP, so a lost segment holds back every later message on
// its connection until it is resent; spread so, a loss delays the probe that was lost (as it
// would delay an application's message) and not the probes behind it. The server tells the
// ones TCP recovered from the rest by their order (results.rs).
'use strict';
const CONNECTIONS = 8;
let sockets = [], timer = null, seq = 0, t0 = 0, next = 0;
const sent = new Map(); // seq -> { at, ws }
const inFlight = new Map(); // socket -> probes unanswered
const now = () => performance.timeOrigin + performance.now();

// The next open socket in turn with no probe in flight, else the one with fewest.
function pick() {
  let best = null;
  for (let i = 0; i < sockets.length; i++) {
    const ws = sockets[(next + i) % sockets.length];
    if (ws.readyState !== WebSocket.OPEN) continue;
    if (best === null || inFlight.get(ws) < inFlight.get(best)) best = ws;
    if (inFlight.get(best) === 0) break;
  }
  if (best !== null) next = (sockets.indexOf(best) + 1) % sockets.length;
  return best;
}

function probe() {
  const ws = pick();
  if (ws === null) return;
  const s = seq++;
  sent.set(s, { at: now(), ws });
  inFlight.set(ws, inFlight.get(ws) + 1);
  ws.send(String(s));
}

function onAnswer(ev) {
  const at = now();
  let r;
  try { r = JSON.parse(ev.data); } catch (_) { return; }
  const p = sent.get(r.seq);
  if (p === undefined) return;
  sent.delete(r.seq);
  inFlight.set(p.ws, inFlight.get(p.ws) - 1);
  const sentAt = p.at;
  postMessage({ type: 'probe', t: (sentAt - t0) / 1000, rtt: at - sentAt, kernel: r.rtt_ms, down: r.down_rtt_ms, up: r.up_rtt_ms, upBytes: r.up_bytes });
}

onmessage = (e) => {
  const m = e.data;
  if (m.type === 'start') {
    t0 = m.t0;
    for (let i = 0; i < CONNECTIONS; i++) {
      const ws = new WebSocket(m.url);
      ws.onmessage = onAnswer;
      ws.onerror = () => postMessage({ type: 'error', why: 'a probe connection to ' + m.url + ' failed' });
      sockets.push(ws);
      inFlight.set(ws, 0);
    }
    timer = setInterval(probe, m.interval);
  } else if (m.type === 'stop') {
    clearInterval(timer);
    // A probe still unanswered a second after the test is a lost one.
    setTimeout(() => {
      const lost = [...sent.values()].map((p) => (p.at - t0) / 1000);
      sent.clear();
      for (const ws of sockets) ws.close();
      sockets = [];
      inFlight.clear();
      postMessage({ type: 'done', lost });
    }, 1000);
  }
};
