// bloatlab's browser test: idle, download, upload and both ways at once, latency probed all the
// while on a WebRTC data channel (where that cannot open, on WebSockets: probe-worker.js). The
// server turns what was measured into a result file of the CLI's format and grades it by the CLI's rules; this page only draws.
// Everything shown from the network goes through textContent, never HTML.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const q = new URLSearchParams(location.search);
  const num = (k, d, lo, hi) => { const v = parseFloat(q.get(k)); return Number.isFinite(v) && v >= lo && v <= hi ? v : d; };
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const state = { status: 'ready', phases: [], rtt: [], kernel: [], downRtt: [], upRtt: [], down: [], up: [], result: null, error: null };
  window.bloatlab = state; // for kiosks, tests and the curious
  // Download bytes as this page reads them; upload bytes as the server received them (a
  // browser counts an upload when its socket takes it, ahead of the line).
  const bytes = { down: 0 };
  const serverUp = { latest: null, sampled: null };
  let t0 = 0, total = 0;
  const since = () => (performance.timeOrigin + performance.now() - t0) / 1000;

  function say(text) { $('status').textContent = text; }
  function fail(why) { state.status = 'failed'; state.error = why; say('The test failed: ' + why); $('start').disabled = false; document.title = 'bloatlab: failed'; }

  // Load: parallel streams of incompressible data, stopped with their phase.
  function downloads(n, signal) {
    for (let i = 0; i < n; i++) {
      (async () => {
        while (!signal.aborted) {
          try {
            const r = await fetch('/large', { signal, cache: 'no-store' });
            if (!r.ok || !r.body) { await refused(r); continue; }
            const reader = r.body.getReader();
            for (;;) { const { done, value } = await reader.read(); if (done) break; bytes.down += value.length; }
          } catch (_) { if (!signal.aborted) await sleep(200); }
        }
      })();
    }
  }
  // The server's per-address limits answer 429 with the reason: the page says so, since the
  // load it measured was then less than asked for.
  async function refused(r) {
    let why = '';
    try { why = (await r.text()).slice(0, 160); } catch (_) { /* the reason is optional */ }
    state.refused = 'the server refused part of the download (' + r.status + ' ' + why + ')';
    await sleep(500);
  }
  let blob = null;
  function uploadBlob() {
    if (blob) return blob;
    const mib = new Uint8Array(1 << 20);
    for (let o = 0; o < mib.length; o += 65536) crypto.getRandomValues(mib.subarray(o, o + 65536));
    blob = new Blob(new Array(8).fill(mib), { type: 'application/octet-stream' });
    return blob;
  }
  function uploads(n, signal) {
    // XHR, not fetch: streaming a Blob body works in every browser (Safari, Firefox too).
    const send = () => {
      if (signal.aborted) return;
      const x = new XMLHttpRequest();
      x.onloadend = () => {
        if (x.status !== 200 && x.status !== 0) state.refused = 'the server refused part of the upload (' + x.status + ' ' + x.responseText.slice(0, 160) + ')';
        if (!signal.aborted) setTimeout(send, x.status === 200 ? 0 : 500);
      };
      signal.addEventListener('abort', () => x.abort(), { once: true });
      x.open('POST', '/slurp');
      x.send(uploadBlob());
    };
    for (let i = 0; i < n; i++) send();
  }

  // Each sample is the rate since the previous one, over the time that really passed (timers
  // fire late on a busy device).
  let lastSample = 0;
  function sample() {
    const t = since(), dt = Math.max(t - lastSample, 1e-3);
    lastSample = t;
    state.down.push([t, bytes.down * 8 / 1e6 / dt]);
    const up = serverUp.latest === null || serverUp.sampled === null ? 0 : serverUp.latest - serverUp.sampled;
    state.up.push([t, up * 8 / 1e6 / dt]);
    bytes.down = 0;
    serverUp.sampled = serverUp.latest;
  }

  // The chart: phases as bands, latency on the left axis, goodput on the right.
  function draw() {
    const c = $('chart'), g = c.getContext('2d');
    const w = c.width = c.clientWidth * devicePixelRatio, h = c.height = c.clientHeight * devicePixelRatio;
    const pad = 40 * devicePixelRatio, fs = 11 * devicePixelRatio;
    g.clearRect(0, 0, w, h);
    g.font = fs + 'px system-ui, sans-serif';
    const x = (t) => pad + (w - 2 * pad) * Math.min(t / total, 1);
    const rtts = state.rtt.map((s) => s[1]).filter((v) => v !== null).sort((a, b) => a - b);
    const maxMs = Math.max(50, rtts.length ? rtts[Math.floor(rtts.length * 0.99)] * 1.15 : 50);
    // Goodput over 0.5 s: the server's upload count arrives in steps.
    const smooth = (samples) => samples.map(([t], i) => { const w = samples.slice(Math.max(0, i - 4), i + 1); return [t, w.reduce((a, x) => a + x[1], 0) / w.length]; });
    const down = smooth(state.down), up = smooth(state.up);
    // Each direction on its own scale, named in its colour: on a 60/4 Mbit/s line one shared
    // scale draws the upload as a flat line at the bottom.
    const top = (samples) => Math.max(0.1, ...samples.map((s) => s[1])) * 1.1;
    const maxDown = top(down), maxUp = top(up);
    const yMs = (v) => h - pad - (h - 2 * pad) * Math.min(v / maxMs, 1);
    const yScale = (max) => (v) => h - pad - (h - 2 * pad) * Math.min(v / max, 1);
    const mbps = (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0)) + ' Mbit/s';
    state.phases.forEach((p, i) => {
      g.fillStyle = i % 2 ? 'rgba(255,255,255,0.03)' : 'rgba(255,255,255,0.06)';
      g.fillRect(x(p.start), pad / 2, x(p.end) - x(p.start), h - pad * 1.5);
      g.fillStyle = '#8a949e';
      g.fillText(p.name, x(p.start) + 4, pad / 2 + fs);
    });
    g.fillStyle = '#8a949e';
    g.fillText('latency to ' + Math.round(maxMs) + ' ms', 2, fs);
    g.textAlign = 'right';
    g.fillStyle = '#4fa3ff'; g.fillText('download to ' + mbps(maxDown), w - 2, h - 4 - 1.3 * fs);
    g.fillStyle = '#ffa94f'; g.fillText('upload to ' + mbps(maxUp), w - 2, h - 4);
    g.textAlign = 'left';
    const line = (samples, y, color, dots) => {
      g.strokeStyle = g.fillStyle = color; g.lineWidth = 1.5 * devicePixelRatio; g.beginPath();
      let on = false;
      for (const [t, v] of samples) {
        if (v === null) { on = false; continue; }
        if (dots) { g.fillRect(x(t) - 1, y(v) - 1, 2.5, 2.5); continue; }
        if (on) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
        on = true;
      }
      if (!dots) g.stroke();
    };
    line(down, yScale(maxDown), '#4fa3ff');
    line(up, yScale(maxUp), '#ffa94f');
    line(state.kernel, yMs, '#b48cff', true);
    line(state.rtt, yMs, '#e8e86a', true);
  }

  // Probers: start() begins probing every `interval` ms, stop() resolves to the send times of
  // the probes never answered. WebRTC first: a data channel unordered and never resent, so a
  // probe the line drops is lost, as the command line's UDP probe is (a WebSocket is TCP: its
  // lost probe is resent and reads as delay). Chromium has no WebRTC in Workers, so these are
  // timed on the page's thread, which does little else. Null where it cannot open in 5 s.
  async function rtcProber() {
    if (typeof RTCPeerConnection !== 'function') return null;
    const pc = new RTCPeerConnection(); // no ICE servers: the server is ICE-lite with one address
    const dc = pc.createDataChannel('probes', { ordered: false, maxRetransmits: 0 });
    try {
      await pc.setLocalDescription(await pc.createOffer());
      const r = await fetch('/rtc', { method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: pc.localDescription.sdp, cache: 'no-store' });
      if (!r.ok) throw new Error('offer refused');
      await pc.setRemoteDescription({ type: 'answer', sdp: await r.text() });
      await new Promise((resolve, reject) => { dc.onopen = resolve; setTimeout(() => reject(new Error('no data channel')), 5000); });
    } catch (_) { pc.close(); return null; }
    const sent = new Map(); // seq -> sent at
    let seq = 0, timer = null, t0 = 0;
    const now = () => performance.timeOrigin + performance.now();
    dc.onmessage = (ev) => {
      const at = now();
      let r;
      try { r = JSON.parse(ev.data); } catch (_) { return; }
      const p = sent.get(r.seq);
      if (p === undefined) return;
      sent.delete(r.seq);
      onProbe({ type: 'probe', t: (p - t0) / 1000, rtt: at - p, kernel: r.rtt_ms, down: r.down_rtt_ms, up: r.up_rtt_ms, upBytes: r.up_bytes });
    };
    return {
      transport: 'webrtc',
      start(interval, start) {
        t0 = start;
        timer = setInterval(() => { if (dc.readyState !== 'open') return; const s = seq++; sent.set(s, now()); dc.send(String(s)); }, interval);
      },
      stop() {
        clearInterval(timer);
        // A probe still unanswered a second after the test is a lost one.
        return new Promise((resolve) => setTimeout(() => {
          const lost = [...sent.values()].map((at) => (at - t0) / 1000);
          pc.close();
          resolve(lost);
        }, 1000));
      },
    };
  }
  // The fallback: WebSockets over TCP, in a Worker (probe-worker.js).
  function wsProber(url) {
    const w = new Worker('/probe-worker.js');
    w.onmessage = (e) => onProbe(e.data);
    return {
      transport: 'websocket',
      start(interval, t0) { w.postMessage({ type: 'start', url, interval, t0 }); },
      stop() {
        return new Promise((resolve) => {
          w.onmessage = (e) => { if (e.data.type === 'done') { w.terminate(); resolve(e.data.lost); } else onProbe(e.data); };
          w.postMessage({ type: 'stop' });
        });
      },
    };
  }
  function onProbe(m) {
    if (m.type === 'probe') {
      state.rtt.push([m.t, m.rtt]);
      state.kernel.push([m.t, m.kernel]);
      state.downRtt.push([m.t, m.down]);
      state.upRtt.push([m.t, m.up]);
      if (typeof m.upBytes === 'number' && (serverUp.latest === null || m.upBytes > serverUp.latest)) serverUp.latest = m.upBytes;
    } else if (m.type === 'error') {
      state.error = m.why;
    }
  }

  async function run() {
    $('start').disabled = true;
    $('result').hidden = true;
    serverUp.latest = serverUp.sampled = null;
    Object.assign(state, { status: 'running', transport: null, rtt: [], kernel: [], downRtt: [], upRtt: [], down: [], up: [], result: null, error: null, refused: null });
    let cfg;
    try { cfg = await (await fetch('/web/config', { cache: 'no-store' })).json(); } catch (e) { return fail('no test configuration from the server'); }
    if (!cfg.ws_port) return fail('this server has no probe port (start it with --ws PORT)');
    const idle = num('idle', cfg.idle, 1, 60), len = num('length', cfg.length, 2, 300);
    const streams = Math.round(num('streams', cfg.streams, 1, 16));
    const step = cfg.step, interval = cfg.probe_ms;
    state.phases = [];
    let at = 0;
    for (const [name, d] of [['idle', idle], ['download', len], ['upload', len], ['both', len]]) {
      state.phases.push({ name, start: at, end: at + d });
      at += d;
    }
    total = at;
    // ?probes=websocket skips WebRTC (to compare the two, or where it is blocked).
    say('Opening the latency probes...');
    let prober = cfg.rtc && q.get('probes') !== 'websocket' ? await rtcProber() : null;
    if (prober === null) {
      const host = location.hostname.includes(':') && !location.hostname.startsWith('[') ? '[' + location.hostname + ']' : location.hostname;
      prober = wsProber((location.protocol === 'https:' ? 'wss://' : 'ws://') + host + ':' + cfg.ws_port + '/ws');
    }
    state.transport = prober.transport;
    t0 = performance.timeOrigin + performance.now();
    prober.start(interval, t0);
    lastSample = 0;
    bytes.down = 0;
    const sampler = setInterval(sample, step * 1000);
    const painter = setInterval(() => { draw(); $('progress').style.width = Math.min(100, 100 * since() / total) + '%'; }, 250);
    const words = { idle: 'Measuring the idle latency', download: 'Downloading', upload: 'Uploading', both: 'Downloading and uploading' };
    try {
      for (const p of state.phases) {
        const wait = p.start - since();
        if (wait > 0) await sleep(wait * 1000);
        say(words[p.name] + '...');
        const stop = new AbortController();
        if (p.name === 'download' || p.name === 'both') downloads(streams, stop.signal);
        if (p.name === 'upload' || p.name === 'both') uploads(streams, stop.signal);
        await sleep(Math.max(0, p.end - since()) * 1000);
        stop.abort();
      }
    } finally {
      clearInterval(sampler);
      clearInterval(painter);
    }
    say('Finishing...');
    for (const t of await prober.stop()) state.rtt.push([t, null]);
    draw();
    const byTime = (a, b) => a[0] - b[0];
    const upload = {
      version: 1, step, probe_interval: interval / 1000, streams, probe_transport: state.transport,
      phases: state.phases,
      rtt: state.rtt.sort(byTime), kernel_rtt: state.kernel.sort(byTime), down_rtt: state.downRtt.sort(byTime), up_rtt: state.upRtt.sort(byTime),
      down: state.down, up: state.up, browser: navigator.userAgent,
    };
    let result;
    try {
      const r = await fetch('/web/result', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(upload) });
      if (!r.ok) return fail('the server did not take the result: ' + (await r.text()).slice(0, 200));
      result = await r.json();
    } catch (e) { return fail('the result could not be sent'); }
    show(result);
  }

  const median = (v) => { const s = v.filter((x) => x !== null && x !== undefined).sort((a, b) => a - b); return s.length ? s[Math.floor(s.length / 2)] : null; };
  const inPhase = (samples, p) => samples.filter(([t]) => t >= p.start + Math.min(2, 0.2 * (p.end - p.start)) && t <= p.end).map(([, v]) => v);
  const mean = (v) => (v.length ? v.reduce((a, x) => a + x, 0) / v.length : null);
  const fmt = (v, d = 1) => (v === null || v === undefined ? '-' : v.toFixed(d));
  const tone = (g) => (!g ? '' : g.startsWith('A') ? 'g-good' : g === 'B' || g === 'C' ? 'g-mid' : 'g-bad');
  function setGrade(id, g) { const el = $(id); el.textContent = g || '-'; el.className = tone(g); }

  function show(result) {
    const s = result.summary;
    state.result = result;
    state.status = 'done';
    setGrade('g-all', s.grade);
    setGrade('g-down', s.grade_by_direction.down);
    setGrade('g-up', s.grade_by_direction.up);
    const added = s.phase_added_latency_ms;
    const idleP50 = s.latency_ms.idle ? s.latency_ms.idle.p50 : null;
    // A phase's median as the server computed it: it leaves out the probes TCP had to resend,
    // whose delay is loss, not a queue (results.rs).
    const serverP50 = (name) => (name === 'idle' ? idleP50 : added[name] === null || added[name] === undefined || idleP50 === null ? null : idleP50 + added[name]);
    const tbody = $('phases');
    tbody.textContent = '';
    for (const p of state.phases) {
      const tr = document.createElement('tr');
      const cells = [p.name, fmt(serverP50(p.name)), p.name === 'idle' ? '' : fmt(added[p.name]),
        fmt(median(inPhase(state.kernel, p))), p.name === 'upload' || p.name === 'idle' ? '' : fmt(mean(inPhase(state.down, p))),
        p.name === 'download' || p.name === 'idle' ? '' : fmt(mean(inPhase(state.up, p)))];
      for (const c of cells) { const td = document.createElement('td'); td.textContent = c; tr.appendChild(td); }
      tbody.appendChild(tr);
    }
    const w = $('words');
    w.textContent = '';
    const para = (text) => { const el = document.createElement('p'); el.textContent = text; w.appendChild(el); };
    const effect = (g) => (g && g.startsWith('A') ? 'calls and games will not notice' : g === 'B' || g === 'C' ? 'calls may stutter and games lag' : 'calls break up and web pages crawl');
    if (idleP50 !== null) para('Idle, your latency to this server was ' + fmt(idleP50) + ' ms.');
    for (const [dir, phase, word] of [['down', 'download', 'downloading'], ['up', 'upload', 'uploading']]) {
      if (added[phase] === null || added[phase] === undefined) continue;
      const g = s.grade_by_direction[dir];
      const rate = s.throughput_mbps[dir];
      const grew = added[phase] < 1 ? 'it stayed within 1 ms of that' : 'it grew by ' + fmt(added[phase]) + ' ms';
      para('While ' + word + ' at ' + fmt(rate) + ' Mbit/s ' + grew + ' (grade ' + g + '): ' + effect(g) + '.');
      // The server caps a grade by the loss under load (analyze::grade): say so when it did.
      const cap = s.grade_by_direction[dir + '_loss_cap'];
      if (cap) para(fmt(cap.loss_percent) + '% of the probes were lost while ' + word + ': the delay alone would grade ' + cap.latency_grade + ', but a line that drops this much is at most ' + cap.at_most + '.');
      if (s.saturated && s.saturated[dir] === false) para('The ' + phase + ' was still speeding up when its phase ended, so it may not have filled your connection: the real delay can be worse.');
    }
    const loaded = state.phases.filter((p) => p.name !== 'idle');
    const countIn = (name) => { const x = result.series.find((v) => v.name === name); return x ? loaded.reduce((n, p) => n + inPhase(x.samples, p).length, 0) : 0; };
    const recovered = countIn('recovered ws'), probes = recovered + countIn('rtt ws');
    const rtc = result.series.find((v) => v.name === 'rtt webrtc');
    if (rtc) {
      const under = loaded.flatMap((p) => inPhase(rtc.samples, p));
      const lost = under.filter((v) => v === null).length;
      para('Latency was probed over WebRTC, where a probe the line drops stays lost: ' + lost + ' of ' + under.length + ' probes under load (' + fmt(under.length ? 100 * lost / under.length : 0, 0) + '%) were lost, and count as loss, not delay.');
    } else if (state.transport === 'websocket') {
      para('Latency was probed over WebSockets (not WebRTC): a probe the line drops is resent by TCP.');
    }
    if (recovered > 0 && probes > 0) {
      para(recovered + ' of ' + probes + ' probes under load (' + fmt(100 * recovered / probes, 0) + '%) were lost on the line and resent by TCP, or waited behind one that was: like the command line\'s lost probes, they are left out of the delays above (loss is not a queue).');
    }
    if (state.refused) para('Note: ' + state.refused + '; the load was smaller than asked for.');
    const pageBoth = serverP50('both');
    const kernBoth = median(inPhase(state.kernel, state.phases[3]));
    if (pageBoth !== null && kernBoth !== null && pageBoth > kernBoth * 1.5 + 10) {
      para('This page saw ' + fmt(pageBoth) + ' ms while the server\'s kernel saw ' + fmt(kernBoth) + ' ms on the same connection: the extra delay is on your side of the network (the device, its Wi-Fi or the browser), not in the path.');
    }
    const file = new Blob([JSON.stringify(result)], { type: 'application/json' });
    $('download').href = URL.createObjectURL(file);
    $('result').hidden = false;
    $('start').disabled = false;
    say('Done: ' + (s.grade ? 'grade ' + s.grade : 'no grade') + '.');
    document.title = 'bloatlab: done ' + (s.grade || '');
  }

  $('start').addEventListener('click', () => run().catch((e) => fail(String(e))));
  window.addEventListener('resize', draw);
  if (q.get('autostart') === '1') run().catch((e) => fail(String(e)));
})();
