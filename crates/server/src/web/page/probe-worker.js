// bloatlab's latency probes, in a Worker so that the page's drawing and load never delay their
// timing: WebSockets on the server's probe port, one numbered message per interval, each
// answer timed with performance.now() and passed on with the server's own view of the path.
// The probes take turns over CONNECTIONS sockets: a WebSocket is TCP, so a lost segment holds
// back every later message on its connection until it is resent; spread over several, a loss
// delays the probe that was lost (as it would delay an application's message) and not the
// probes behind it.
'use strict';
const CONNECTIONS = 4;
let sockets = [], timer = null, seq = 0, t0 = 0;
const sent = new Map();
const now = () => performance.timeOrigin + performance.now();

function probe() {
  const open = sockets.filter((w) => w.readyState === WebSocket.OPEN);
  if (!open.length) return;
  const s = seq++;
  sent.set(s, now());
  open[s % open.length].send(String(s));
}

function onAnswer(ev) {
  const at = now();
  let r;
  try { r = JSON.parse(ev.data); } catch (_) { return; }
  const sentAt = sent.get(r.seq);
  if (sentAt === undefined) return;
  sent.delete(r.seq);
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
    }
    timer = setInterval(probe, m.interval);
  } else if (m.type === 'stop') {
    clearInterval(timer);
    // A probe still unanswered a second after the test is a lost one.
    setTimeout(() => {
      const lost = [...sent.values()].map((at) => (at - t0) / 1000);
      sent.clear();
      for (const ws of sockets) ws.close();
      sockets = [];
      postMessage({ type: 'done', lost });
    }, 1000);
  }
};
