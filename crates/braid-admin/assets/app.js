// Braid's web dashboard: a single page in plain JavaScript (no framework, no build step) over
// the REST API under /api/v1. Hash routes: #/overview, #/clients, #/clients/<id>,
// #/subscriptions, #/retained, #/listeners, #/nodes, #/bridges, #/rules. With admin.api_keys_file set
// the API answers 401 until the operator enters a key, which this tab keeps in sessionStorage
// and sends as `Authorization: Bearer KEY`. Elements tests look for carry data-testid.
'use strict';

(() => {
  const KEY_STORAGE = 'braid.apiKey';
  const CHART_WINDOW_MS = 120 * 1000;

  // ---- DOM --------------------------------------------------------------------------------

  /** h('tag', {attr: value, onclick: fn, text: '...'}, ...children) */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'value') el.value = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  const byId = (id) => document.getElementById(id);

  function debounce(fn, ms) {
    let timer = null;
    return (...args) => {
      clearTimeout(timer);
      timer = setTimeout(() => fn(...args), ms);
    };
  }

  // ---- formatting -------------------------------------------------------------------------

  const dash = '—';

  function fmtNumber(n) {
    if (n === null || n === undefined) return dash;
    if (!Number.isFinite(n)) return String(n);
    const digits = Number.isInteger(n) || Math.abs(n) >= 100 ? 0 : Math.abs(n) >= 10 ? 1 : 2;
    return n.toLocaleString('en-US', { maximumFractionDigits: digits });
  }

  function fmtBytes(n) {
    if (n === null || n === undefined) return dash;
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return `${i === 0 ? n : n.toFixed(n >= 100 ? 0 : 1)} ${units[i]}`;
  }

  function fmtDuration(secs) {
    if (secs === null || secs === undefined) return dash;
    const d = Math.floor(secs / 86400);
    const hrs = Math.floor((secs % 86400) / 3600);
    const m = Math.floor((secs % 3600) / 60);
    const s = Math.floor(secs % 60);
    if (d) return `${d}d ${hrs}h ${m}m`;
    if (hrs) return `${hrs}h ${m}m ${s}s`;
    if (m) return `${m}m ${s}s`;
    return `${s}s`;
  }

  function fmtTime(unixSecs) {
    if (!unixSecs) return dash;
    return new Date(unixSecs * 1000).toLocaleString();
  }

  const PROTOCOLS = { 3: 'MQTT 3.1', 4: 'MQTT 3.1.1', 5: 'MQTT 5.0' };

  function fmtValue(v) {
    if (v === null || v === undefined || v === '') return dash;
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    if (typeof v === 'number') return fmtNumber(v);
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }

  function fmtExpiry(secs) {
    if (secs === 4294967295) return 'never';
    return secs ? fmtDuration(secs) : '0 (ends with the connection)';
  }

  // ---- the API ----------------------------------------------------------------------------

  class ApiError extends Error {
    /** `said`: the API's own words (its `error`), without the method and path. */
    constructor(status, message, code, said) {
      super(message);
      this.status = status;
      this.code = code;
      this.said = said || message;
    }
  }

  /** One path segment, or a topic with its levels kept apart by '/'. */
  const seg = (s) => encodeURIComponent(s);
  const topicPath = (t) => t.split('/').map(encodeURIComponent).join('/');

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== null && v !== undefined && v !== '') q.set(k, v);
    }
    const s = q.toString();
    return s ? `?${s}` : '';
  }

  /**
   * Calls the API, with `options.body` (if any) sent as JSON; resolves to the JSON body (null for
   * 204), rejects with an ApiError.
   */
  async function api(path, options = {}) {
    const method = options.method || 'GET';
    const headers = { accept: 'application/json' };
    const key = sessionStorage.getItem(KEY_STORAGE);
    if (key) headers.authorization = `Bearer ${key}`;
    let body;
    if (options.body !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(options.body);
    }
    let res;
    try {
      res = await fetch(`/api/v1${path}`, { method, headers, body, cache: 'no-store' });
    } catch (e) {
      setStatus(false, 'broker unreachable');
      throw new ApiError(0, `${method} /api/v1${path}: the broker is unreachable (${e.message})`, 'NETWORK');
    }
    setStatus(true);
    if (res.status === 204) return null;
    const text = await res.text();
    let answer = null;
    try {
      answer = text ? JSON.parse(text) : null;
    } catch (_) {
      answer = null;
    }
    const said = answer && typeof answer.error === 'string' ? answer.error : `${res.status} ${res.statusText}`;
    if (res.status === 401) {
      setStatus(false, 'API key needed');
      askForKey(key ? said : null);
      throw new ApiError(401, said, 'UNAUTHORIZED');
    }
    if (!res.ok) {
      throw new ApiError(res.status, `${method} /api/v1${path}: ${said}`, answer && answer.code, said);
    }
    return answer;
  }

  // ---- page furniture: status, errors, notices, the key prompt ----------------------------

  function setStatus(ok, text) {
    const el = byId('status');
    el.textContent = ok ? 'live' : text;
    el.className = `status ${ok ? 'ok' : 'bad'}`;
  }

  function showError(e) {
    if (e instanceof ApiError && e.status === 401) return; // the key prompt says it
    const el = byId('error');
    const code = e && e.code && e.code !== 'NETWORK' ? ` (${e.code})` : '';
    el.textContent = `${(e && e.message) || e}${code}`;
    el.hidden = false;
  }

  function clearError() {
    const el = byId('error');
    el.hidden = true;
    el.textContent = '';
  }

  /** A short-lived confirmation in the view's notice area. */
  function notify(view, text) {
    const el = view.querySelector('[data-testid="notice"]');
    if (!el) return;
    el.textContent = text;
    el.hidden = false;
    clearTimeout(el._timer);
    el._timer = setTimeout(() => {
      el.hidden = true;
    }, 6000);
  }

  function askForKey(problem) {
    const modal = byId('key-modal');
    const p = byId('key-problem');
    p.hidden = !problem;
    p.textContent = problem ? `${problem}: enter another key.` : '';
    if (modal.hidden) {
      modal.hidden = false;
      byId('key-input').value = '';
      byId('key-input').focus();
    }
  }

  function setupKeyPrompt() {
    byId('key-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const key = byId('key-input').value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORAGE, key);
      byId('key-modal').hidden = true;
      byId('forget-key').hidden = false;
      render();
    });
    const forget = byId('forget-key');
    forget.hidden = !sessionStorage.getItem(KEY_STORAGE);
    forget.addEventListener('click', () => {
      sessionStorage.removeItem(KEY_STORAGE);
      forget.hidden = true;
      render();
    });
  }

  // ---- repeating work ---------------------------------------------------------------------

  /**
   * Runs `task` now and then `ms` after each run ends, until stopped; `now()` runs it at once
   * (or right after the run under way), for a page that changed what it shows.
   */
  function every(ms, task) {
    let stopped = false;
    let timer = null;
    let running = false;
    let again = false;
    const run = async () => {
      if (stopped) return;
      if (running) {
        again = true;
        return;
      }
      running = true;
      clearTimeout(timer);
      try {
        await task();
      } catch (e) {
        showError(e);
      }
      running = false;
      if (stopped) return;
      if (again) {
        again = false;
        run();
      } else {
        timer = setTimeout(run, ms);
      }
    };
    run();
    return {
      stop() {
        stopped = true;
        clearTimeout(timer);
      },
      now: run,
    };
  }

  // ---- tables -----------------------------------------------------------------------------

  /**
   * A table: `columns` are {label, cell(row) -> text or Node, class?}; `rowAttrs(row)` gives each
   * <tr>'s attributes. `empty` is shown when there are no rows.
   */
  function table(columns, rows, rowAttrs, empty) {
    if (!rows.length) return h('p', { class: 'empty', 'data-testid': 'empty' }, empty || 'Nothing to show.');
    return h('div', { class: 'table-wrap' },
      h('table', {},
        h('thead', {}, h('tr', {}, columns.map((c) => h('th', { class: c.class }, c.label)))),
        h('tbody', {}, rows.map((r) =>
          h('tr', rowAttrs ? rowAttrs(r) : {}, columns.map((c) => {
            const v = c.cell(r);
            return h('td', { class: c.class }, v instanceof Node ? v : fmtValue(v));
          }))))));
  }

  /** Paging controls for `{page, limit, count}`; `go(page)` changes page. */
  function pager(meta, go) {
    const pages = Math.max(1, Math.ceil(meta.count / meta.limit));
    const first = meta.count ? (meta.page - 1) * meta.limit + 1 : 0;
    const last = Math.min(meta.count, meta.page * meta.limit);
    return h('div', { class: 'pager' },
      h('button', { type: 'button', 'data-testid': 'pager-prev', disabled: meta.page <= 1, onclick: () => go(meta.page - 1) }, '‹ Previous'),
      h('span', { 'data-testid': 'pager-info' }, `${first}–${last} of ${meta.count} · page ${meta.page} of ${pages}`),
      h('button', { type: 'button', 'data-testid': 'pager-next', disabled: meta.page >= pages, onclick: () => go(meta.page + 1) }, 'Next ›'));
  }

  /** Replaces `box`'s content with `node` unless the data it shows (`key`) is unchanged. */
  function swap(box, key, make) {
    if (box._key === key) return;
    box._key = key;
    box.replaceChildren(make());
  }

  function pageHeader(title, ...extra) {
    return h('div', { class: 'page-head' }, h('h1', {}, title), h('span', { class: 'spacer' }), extra,
      h('p', { class: 'notice', 'data-testid': 'notice', role: 'status', hidden: true }));
  }

  function clientLink(id) {
    return h('a', { href: `#/clients/${seg(id)}`, 'data-testid': `client-link-${id}` }, id);
  }

  function stateBadge(connected, testid) {
    return h('span', { class: `badge ${connected ? 'on' : 'off'}`, 'data-testid': testid },
      connected ? 'connected' : 'offline');
  }

  async function kick(view, id, after) {
    if (!window.confirm(`Disconnect client "${id}"? (It may connect again; its session stays if it is persistent.)`)) return;
    try {
      await api(`/clients/${seg(id)}`, { method: 'DELETE' });
      notify(view, `Disconnected client "${id}".`);
    } catch (e) {
      showError(e);
    }
    after();
  }

  // ---- charts -----------------------------------------------------------------------------

  function cssVar(name, fallback) {
    const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  /** The smallest "nice" number (1, 2, 2.5 or 5 times a power of ten) at least `v`. */
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const e = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) {
      if (m * e >= v) return m * e;
    }
    return 10 * e;
  }

  /**
   * Draws line `series` ({color, points: [[ms, value or null], ...]}) over the last `span` ms up
   * to `now` on `canvas`, with a grid and labelled axes. `integer`: the values are counts.
   */
  function drawChart(canvas, series, now, span, integer) {
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);

    const pad = { left: 52, right: 12, top: 10, bottom: 24 };
    const pw = width - pad.left - pad.right;
    const ph = height - pad.top - pad.bottom;
    let max = 0;
    for (const s of series) for (const [, v] of s.points) if (v !== null && v > max) max = v;
    let top = niceCeil(max * 1.1);
    if (integer) top = Math.max(4, Math.ceil(top / 4) * 4);
    const x = (t) => pad.left + pw * (1 - (now - t) / span);
    const y = (v) => pad.top + ph * (1 - v / top);

    ctx.font = '11px system-ui, -apple-system, "Segoe UI", sans-serif';
    ctx.lineWidth = 1;
    ctx.strokeStyle = cssVar('--chart-grid', '#e3e6ea');
    ctx.fillStyle = cssVar('--muted', '#667');
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(pad.left, yy);
      ctx.lineTo(width - pad.right, yy);
      ctx.stroke();
      ctx.fillText(fmtNumber(v), pad.left - 6, yy);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    for (let ago = 0; ago <= span / 1000; ago += 30) {
      const xx = x(now - ago * 1000);
      ctx.fillText(ago ? `-${ago}s` : 'now', Math.min(xx, width - pad.right - 10), height - pad.bottom + 6);
    }

    ctx.save();
    ctx.beginPath();
    ctx.rect(pad.left, pad.top - 2, pw, ph + 4);
    ctx.clip();
    ctx.lineJoin = 'round';
    ctx.lineCap = 'round';
    for (const s of series) {
      // Runs of known values, split where a value is missing.
      const runs = [[]];
      for (const [t, v] of s.points) {
        if (v === null) {
          if (runs[runs.length - 1].length) runs.push([]);
        } else {
          runs[runs.length - 1].push([x(t), y(v)]);
        }
      }
      for (const run of runs.filter((r) => r.length)) {
        ctx.globalAlpha = 0.12;
        ctx.fillStyle = s.color;
        ctx.beginPath();
        ctx.moveTo(run[0][0], y(0));
        for (const [px, py] of run) ctx.lineTo(px, py);
        ctx.lineTo(run[run.length - 1][0], y(0));
        ctx.closePath();
        ctx.fill();
        ctx.globalAlpha = 1;
        ctx.strokeStyle = s.color;
        ctx.lineWidth = 2;
        ctx.beginPath();
        run.forEach(([px, py], i) => (i ? ctx.lineTo(px, py) : ctx.moveTo(px, py)));
        if (run.length === 1) ctx.lineTo(run[0][0] + 0.1, run[0][1]);
        ctx.stroke();
      }
    }
    ctx.restore();
  }

  // ---- overview ---------------------------------------------------------------------------

  // Kept across visits to the overview, so that coming back shows the recent past.
  const samples = []; // {t, connected, in, out}: in/out are per second, null when unknown
  let previous = null; // {t, received, sent, uptime}

  const sumQos = (byQos) => Object.values(byQos || {}).reduce((a, b) => a + b, 0);

  function record(stats, t) {
    const received = sumQos(stats.messages.received);
    const sent = sumQos(stats.messages.sent);
    let rateIn = null;
    let rateOut = null;
    // A rate needs a recent earlier sample of the same broker run (counters only grow).
    if (previous && t - previous.t < 10000 && t > previous.t && stats.uptime_secs >= previous.uptime
        && received >= previous.received && sent >= previous.sent) {
      const dt = (t - previous.t) / 1000;
      rateIn = (received - previous.received) / dt;
      rateOut = (sent - previous.sent) / dt;
    }
    previous = { t, received, sent, uptime: stats.uptime_secs };
    samples.push({ t, connected: stats.connections.connected, in: rateIn, out: rateOut });
    while (samples.length && samples[0].t < t - CHART_WINDOW_MS - 5000) samples.shift();
  }

  function overview(view) {
    const tile = (label, testid) => {
      const value = h('div', { class: 'tile-value', 'data-testid': testid }, dash);
      const note = h('div', { class: 'tile-note', 'data-testid': `${testid}-note` });
      return { el: h('div', { class: 'tile card' }, h('div', { class: 'tile-label' }, label), value, note), value, note };
    };
    const tiles = {
      connected: tile('Connected clients', 'connected-count'),
      sessions: tile('Sessions', 'sessions-count'),
      subscriptions: tile('Subscriptions', 'subscriptions-count'),
      retained: tile('Retained messages', 'retained-count'),
      queued: tile('Queued messages', 'queued-count'),
      rateIn: tile('Messages in / s', 'rate-in'),
      rateOut: tile('Messages out / s', 'rate-out'),
      memory: tile('Memory (resident)', 'memory'),
      uptime: tile('Uptime', 'uptime'),
      version: tile('Version', 'version'),
    };
    const legend = (items) => h('div', { class: 'legend' }, items.map(([color, label, testid]) =>
      h('span', {}, h('i', { style: `background:${color}` }), label, ' ', h('b', { 'data-testid': testid }, dash))));
    const c1 = cssVar('--series-1', '#2f6fde');
    const c2 = cssVar('--series-2', '#e0802b');
    const connCanvas = h('canvas', { class: 'chart', 'data-testid': 'chart-connections', 'aria-label': 'Connected clients over the last two minutes', role: 'img' });
    const msgCanvas = h('canvas', { class: 'chart', 'data-testid': 'chart-messages', 'aria-label': 'Messages in and out per second over the last two minutes', role: 'img' });
    view.append(
      pageHeader('Overview'),
      h('section', { class: 'tiles' }, Object.values(tiles).map((t) => t.el)),
      h('section', { class: 'charts' },
        h('div', { class: 'card chart-card' }, h('h2', {}, 'Connected clients'),
          legend([[c1, 'connected', 'legend-connected']]), connCanvas),
        h('div', { class: 'card chart-card' }, h('h2', {}, 'Messages per second'),
          legend([[c1, 'in', 'legend-in'], [c2, 'out', 'legend-out']]), msgCanvas)));

    const draw = () => {
      const now = Date.now();
      drawChart(connCanvas, [{ color: c1, points: samples.map((s) => [s.t, s.connected]) }], now, CHART_WINDOW_MS, true);
      drawChart(msgCanvas, [
        { color: c1, points: samples.map((s) => [s.t, s.in]) },
        { color: c2, points: samples.map((s) => [s.t, s.out]) },
      ], now, CHART_WINDOW_MS, false);
      connCanvas.dataset.samples = String(samples.length);
      msgCanvas.dataset.samples = String(samples.filter((s) => s.in !== null).length);
    };
    draw();
    window.addEventListener('resize', draw);

    const poller = every(1000, async () => {
      const s = await api('/stats');
      const t = Date.now();
      record(s, t);
      clearError();
      const last = samples[samples.length - 1];
      const set = (t2, v, note) => {
        t2.value.textContent = v;
        t2.note.textContent = note || '';
      };
      const byTransport = Object.entries(s.connections.by_transport || {}).filter(([, n]) => n)
        .map(([k, n]) => `${k} ${n}`).join(' · ');
      set(tiles.connected, fmtNumber(s.connections.connected), `peak ${fmtNumber(s.connections.maximum)}${byTransport ? ` · ${byTransport}` : ''}`);
      set(tiles.sessions, fmtNumber(s.sessions), `${fmtNumber(s.connections.parked)} parked`);
      set(tiles.subscriptions, fmtNumber(s.subscriptions));
      set(tiles.retained, fmtNumber(s.retained), 'with the broker\'s own under $SYS');
      set(tiles.queued, fmtNumber(s.queued), `${fmtNumber(s.inflight)} in flight`);
      set(tiles.rateIn, last.in === null ? dash : fmtNumber(last.in), `${fmtBytes(s.bytes.received)} received`);
      set(tiles.rateOut, last.out === null ? dash : fmtNumber(last.out), `${fmtBytes(s.bytes.sent)} sent`);
      set(tiles.memory, fmtBytes(s.memory.resident_bytes), s.memory.alarm ? 'memory alarm raised' : '');
      tiles.memory.el.classList.toggle('alarm', !!s.memory.alarm);
      set(tiles.uptime, fmtDuration(s.uptime_secs));
      set(tiles.version, s.version || dash);
      view.querySelector('[data-testid="legend-connected"]').textContent = fmtNumber(last.connected);
      view.querySelector('[data-testid="legend-in"]').textContent = last.in === null ? dash : fmtNumber(last.in);
      view.querySelector('[data-testid="legend-out"]').textContent = last.out === null ? dash : fmtNumber(last.out);
      draw();
    });
    return {
      stop() {
        poller.stop();
        window.removeEventListener('resize', draw);
      },
    };
  }

  // ---- clients ----------------------------------------------------------------------------

  function clients(view) {
    const state = { prefix: '', state: '', page: 1, limit: 50 };
    const search = h('input', {
      type: 'search', placeholder: 'Client id starts with…', 'data-testid': 'client-search', 'aria-label': 'Client id prefix',
      oninput: debounce(() => {
        state.prefix = search.value;
        state.page = 1;
        poller.now();
      }, 250),
    });
    const filter = h('select', {
      'data-testid': 'client-state-filter', 'aria-label': 'Connection state',
      onchange: () => {
        state.state = filter.value;
        state.page = 1;
        poller.now();
      },
    }, h('option', { value: '' }, 'Connected and offline'), h('option', { value: 'connected' }, 'Connected'),
    h('option', { value: 'offline' }, 'Offline'));
    const limit = h('select', {
      'data-testid': 'client-limit', 'aria-label': 'Rows per page',
      onchange: () => {
        state.limit = Number(limit.value);
        state.page = 1;
        poller.now();
      },
    }, [25, 50, 100, 500].map((n) => h('option', { value: n, selected: n === state.limit }, `${n} per page`)));
    const box = h('div', { 'data-testid': 'clients-table' });
    view.append(pageHeader('Clients'), h('div', { class: 'toolbar' }, search, filter, limit), box);

    const columns = [
      { label: 'Client id', cell: (c) => clientLink(c.client_id) },
      { label: 'State', cell: (c) => stateBadge(c.connected, `client-state-${c.client_id}`) },
      { label: 'Transport', cell: (c) => c.transport },
      { label: 'Peer', cell: (c) => c.peer },
      { label: 'User', cell: (c) => c.username },
      { label: 'Protocol', cell: (c) => PROTOCOLS[c.protocol] || c.protocol },
      { label: 'Keep alive', class: 'num', cell: (c) => (c.keep_alive === null ? null : `${c.keep_alive} s`) },
      { label: 'Queued', class: 'num', cell: (c) => c.queued },
      { label: 'In flight', class: 'num', cell: (c) => c.inflight },
      { label: 'Subscriptions', class: 'num', cell: (c) => c.subscriptions },
      {
        label: '', class: 'actions',
        cell: (c) => (c.connected
          ? h('button', { type: 'button', class: 'danger', 'data-testid': `kick-${c.client_id}`, onclick: () => kick(view, c.client_id, () => poller.now()) }, 'Kick')
          : h('span')),
      },
    ];
    const poller = every(2000, async () => {
      const body = await api(`/clients${query({ prefix: state.prefix, state: state.state, page: state.page, limit: state.limit })}`);
      clearError();
      const pages = Math.max(1, Math.ceil(body.meta.count / body.meta.limit));
      if (state.page > pages) {
        state.page = pages;
        poller.now();
        return;
      }
      swap(box, JSON.stringify(body), () => h('div', {},
        table(columns, body.data, (c) => ({ 'data-testid': `client-row-${c.client_id}` }),
          state.prefix || state.state ? 'No client matches.' : 'No clients: no connections and no kept sessions.'),
        pager(body.meta, (p) => {
          state.page = p;
          poller.now();
        })));
    });
    return poller;
  }

  function clientDetail(view, id) {
    const box = h('div', { 'data-testid': 'client-detail' });
    const kickButton = h('button', {
      type: 'button', class: 'danger', 'data-testid': `kick-${id}`, hidden: true,
      onclick: () => kick(view, id, () => poller.now()),
    }, 'Kick');
    view.append(
      h('p', { class: 'crumbs' }, h('a', { href: '#/clients', 'data-testid': 'back-to-clients' }, '‹ Clients')),
      pageHeader(`Client ${id}`, kickButton), box);
    const poller = every(2000, async () => {
      let c;
      try {
        c = await api(`/clients/${seg(id)}`);
      } catch (e) {
        if (e.status === 404) {
          kickButton.hidden = true;
          swap(box, '404', () => h('p', { class: 'empty', 'data-testid': 'client-gone' },
            `No session of client "${id}" on this node (it disconnected with a clean session, or never connected).`));
          clearError();
          return;
        }
        throw e;
      }
      clearError();
      kickButton.hidden = !c.connected;
      swap(box, JSON.stringify(c), () => {
        const rows = [
          ['State', stateBadge(c.connected, `client-state-${c.client_id}`)],
          ['Transport', c.transport], ['Peer', c.peer], ['User', c.username],
          ['Protocol', PROTOCOLS[c.protocol] || c.protocol],
          ['Keep alive', c.keep_alive === null ? null : `${c.keep_alive} s`],
          ['Connected at', c.connected ? fmtTime(c.connected_at) : null],
          ['Persistent session', c.persistent], ['Session expiry', fmtExpiry(c.expiry_secs)],
          ['Queued', c.queued], ['In flight', c.inflight], ['Dropped', c.dropped],
        ];
        return h('div', {},
          h('dl', { class: 'card facts' }, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v instanceof Node ? v : fmtValue(v))])),
          h('h2', {}, `Subscriptions (${c.subscriptions.length})`),
          subscriptionTable(c.subscriptions, false));
      });
    });
    return poller;
  }

  function subscriptionTable(subs, withClient) {
    const columns = [
      withClient && { label: 'Client id', cell: (s) => clientLink(s.client_id) },
      { label: 'Filter', cell: (s) => h('code', {}, s.filter) },
      { label: 'QoS', class: 'num', cell: (s) => s.qos },
      { label: 'No local', cell: (s) => s.no_local },
      { label: 'Retain as published', cell: (s) => s.retain_as_published },
      { label: 'Retain handling', class: 'num', cell: (s) => s.retain_handling },
      { label: 'Subscription id', class: 'num', cell: (s) => s.subscription_id },
    ].filter(Boolean);
    return table(columns, subs, (s) => ({ 'data-testid': `subscription-row-${s.client_id ? `${s.client_id}-` : ''}${s.filter}` }),
      'No subscriptions.');
  }

  // ---- subscriptions ----------------------------------------------------------------------

  function subscriptions(view) {
    const state = { client_id: '', filter: '', page: 1, limit: 100 };
    const input = (key, placeholder, testid) => {
      const el = h('input', {
        type: 'search', placeholder, 'data-testid': testid, 'aria-label': placeholder,
        oninput: debounce(() => {
          state[key] = el.value.trim();
          state.page = 1;
          poller.now();
        }, 300),
      });
      return el;
    };
    const box = h('div', { 'data-testid': 'subscriptions-table' });
    view.append(pageHeader('Subscriptions'),
      h('div', { class: 'toolbar' }, input('client_id', 'Client id (exact)', 'subscription-client-filter'),
        input('filter', 'Topic filter (exact)', 'subscription-filter')), box);
    const poller = every(3000, async () => {
      const body = await api(`/subscriptions${query(state)}`);
      clearError();
      swap(box, JSON.stringify(body), () => h('div', {}, subscriptionTable(body.data, true),
        pager(body.meta, (p) => {
          state.page = p;
          poller.now();
        })));
    });
    return poller;
  }

  // ---- retained ---------------------------------------------------------------------------

  function retained(view) {
    const state = { filter: '#', page: 1, limit: 100 };
    const filter = h('input', {
      type: 'search', value: '#', placeholder: 'Topic filter, e.g. sensors/#', 'data-testid': 'retained-filter',
      'aria-label': 'Topic filter',
      oninput: debounce(() => {
        state.filter = filter.value.trim() || '#';
        state.page = 1;
        poller.now();
      }, 300),
    });
    const box = h('div', { 'data-testid': 'retained-table' });
    view.append(pageHeader('Retained messages'),
      h('div', { class: 'toolbar' }, filter,
        h('span', { class: 'hint' }, 'A filter starting with # or + leaves out the broker\'s own topics: $SYS/# shows those.')),
      box);

    const remove = async (topic) => {
      if (!window.confirm(`Delete the retained message of "${topic}"?`)) return;
      try {
        await api(`/retained/${topicPath(topic)}`, { method: 'DELETE' });
        notify(view, `Deleted the retained message of "${topic}".`);
      } catch (e) {
        showError(e);
      }
      poller.now();
    };
    const payload = (m) => {
      const text = m.payload.length > 160 ? `${m.payload.slice(0, 160)}…` : m.payload;
      return h('span', { class: 'payload' }, m.payload_encoding === 'base64' ? h('span', { class: 'badge' }, 'base64') : null,
        h('code', { 'data-testid': `retained-payload-${m.topic}` }, text));
    };
    const columns = [
      { label: 'Topic', cell: (m) => h('code', {}, m.topic) },
      { label: 'Payload', cell: payload },
      { label: 'Size', class: 'num', cell: (m) => fmtBytes(m.payload_bytes) },
      { label: 'QoS', class: 'num', cell: (m) => m.qos },
      { label: 'Content type', cell: (m) => m.properties && m.properties.content_type },
      {
        label: '', class: 'actions',
        cell: (m) => h('button', { type: 'button', class: 'danger', 'data-testid': `delete-retained-${m.topic}`, onclick: () => remove(m.topic) }, 'Delete'),
      },
    ];
    const poller = every(3000, async () => {
      const body = await api(`/retained${query(state)}`);
      clearError();
      swap(box, JSON.stringify(body), () => h('div', {},
        table(columns, body.data, (m) => ({ 'data-testid': `retained-row-${m.topic}` }), 'No retained messages match.'),
        pager(body.meta, (p) => {
          state.page = p;
          poller.now();
        })));
    });
    return poller;
  }

  // ---- listeners, nodes, bridges ----------------------------------------------------------

  /** Columns for arbitrary records: `first` in that order, then every other key seen. */
  function columnsOf(rows, first) {
    const keys = [...first];
    for (const r of rows) for (const k of Object.keys(r)) if (!keys.includes(k)) keys.push(k);
    const present = keys.filter((k) => rows.some((r) => k in r));
    const badge = (v) => h('span', { class: `badge ${v === 'up' ? 'on' : 'off'}` }, fmtValue(v));
    return present.map((k) => ({ key: k, label: k.replace(/_/g, ' '), cell: (r) => (k === 'state' ? badge(r[k]) : r[k]) }));
  }

  /** A page listing `path`'s data; `columns(rows, view, refresh)` gives the table's columns. */
  function listPage(title, path, testid, columns, empty) {
    return (view) => {
      const box = h('div', { 'data-testid': testid });
      view.append(pageHeader(title), box);
      const poller = every(5000, async () => {
        const body = await api(path);
        clearError();
        swap(box, JSON.stringify(body), () => table(columns(body.data, view, () => poller.now()), body.data,
          (r) => ({ 'data-testid': `${testid.replace(/-table$/, '')}-row-${r.name || r.address || ''}` }), empty));
      });
      return poller;
    };
  }

  const listeners = listPage('Listeners', '/listeners', 'listeners-table', () => [
    { label: 'Transport', cell: (l) => l.transport },
    { label: 'Address', cell: (l) => h('code', {}, l.address) },
    { label: 'Connected', class: 'num', cell: (l) => l.connected },
    { label: 'Accepted', class: 'num', cell: (l) => l.accepted },
  ], 'No listeners.');

  /** Drains a cluster node (at the API's default rate), or cancels its drain. */
  async function drainNode(view, node, cancel, after) {
    const question = cancel
      ? `Cancel the drain of node "${node}"? It accepts connections again.`
      : `Drain node "${node}"? It refuses new connections and sends its clients to the other nodes, then stays drained until it is stopped.`;
    if (!window.confirm(question)) return;
    try {
      await api(`/nodes/${seg(node)}/drain`, { method: cancel ? 'DELETE' : 'POST' });
      notify(view, cancel ? `Cancelled the drain of node "${node}".` : `Node "${node}" drains.`);
    } catch (e) {
      showError(e);
    }
    after();
  }

  const drainText = (d) => d && `${d.state}: ${fmtNumber(d.moved)} moved, ${fmtNumber(d.remaining)} left (${fmtNumber(d.rate)}/s)`;

  const nodes = listPage('Nodes', '/nodes', 'nodes-table', (rows, view, refresh) => [
    ...columnsOf(rows, ['name', 'this_node', 'state', 'connections', 'drain', 'clustered'])
      .filter((c) => c.key !== 'draining')
      .map((c) => (c.key === 'drain' ? { ...c, cell: (r) => drainText(r.drain) } : c)),
    {
      label: '', class: 'actions',
      cell: (r) => (r.clustered ? h('button', {
        type: 'button', class: r.draining ? null : 'danger', 'data-testid': `drain-${r.name}`,
        onclick: () => drainNode(view, r.name, r.draining, refresh),
      }, r.draining ? 'Cancel drain' : 'Drain') : null),
    },
  ], 'No nodes.');

  const bridges = listPage('Bridges', '/bridges', 'bridges-table',
    (rows) => columnsOf(rows, ['name', 'kind', 'state']), 'No bridges are configured.');

  // ---- rules and sinks --------------------------------------------------------------------

  /** A number in a table cell that tests can find: `testid`. */
  const counter = (testid, n) => h('span', { 'data-testid': testid }, fmtNumber(n));

  /**
   * The rule tester, as EMQX's: a statement and a sample message in, POST /rules/test, and the
   * answer shown (the output, "not selected", or the refusal naming the position). Nothing is
   * published and no counter moves. `load(sql)` puts a rule's statement in it.
   */
  function ruleTester() {
    const area = (testid, label, placeholder, rows) => h('textarea', {
      class: 'mono', rows, spellcheck: 'false', 'data-testid': testid, 'aria-label': label, placeholder,
    });
    const text = (testid, label, placeholder) => h('input', {
      type: 'text', spellcheck: 'false', 'data-testid': testid, 'aria-label': label, placeholder,
    });
    const sql = area('rule-test-sql', 'SQL', 'SELECT clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30', 4);
    sql.required = true;
    const topic = text('rule-test-topic', 'Topic', 'sensors/a1/temp');
    const clientid = text('rule-test-clientid', 'Client id', 'a1');
    const username = text('rule-test-username', 'Username', 'none');
    const payload = area('rule-test-payload', 'Payload', '{"temp": 35}', 3);
    const run = h('button', { type: 'submit', 'data-testid': 'rule-test-run' }, 'Run test');
    const result = h('div', { class: 'test-result', 'data-testid': 'rule-test-result', 'aria-live': 'polite', hidden: true });

    const show = (kind, verdict, detail, testid) => {
      result.className = `test-result ${kind}`;
      result.replaceChildren(h('p', { class: 'verdict', 'data-testid': 'rule-test-verdict' }, verdict),
        detail === undefined ? null : h('pre', { class: 'mono', 'data-testid': testid }, detail));
      result.hidden = false;
    };
    const test = async (ev) => {
      ev.preventDefault();
      const context = { payload: payload.value, clientid: clientid.value.trim() };
      if (topic.value.trim()) context.topic = topic.value.trim();
      if (username.value.trim()) context.username = username.value.trim();
      run.disabled = true;
      try {
        const answer = await api('/rules/test', { method: 'POST', body: { sql: sql.value, context } });
        if (answer.matched) {
          show('matched', 'The rule selects this message. Its output:', JSON.stringify(answer.output, null, 2), 'rule-test-output');
        } else {
          show('unmatched', 'The rule does not select this message: its FROM or WHERE leaves it out.');
        }
      } catch (e) {
        if (e.status === 400) show('failed', 'The broker refuses the test:', e.said, 'rule-test-error');
        else show('failed', 'The test did not run:', (e && e.message) || String(e), 'rule-test-error');
      }
      run.disabled = false;
    };
    const field = (label, input) => h('label', {}, label, input);
    const el = h('form', { class: 'card tester', 'data-testid': 'rule-test-form', autocomplete: 'off', onsubmit: test },
      field('SQL', sql),
      h('div', { class: 'sample' }, field('Topic', topic), field('Client id', clientid), field('Username', username)),
      field('Payload', payload),
      h('div', { class: 'tester-actions' }, run,
        h('span', { class: 'hint' }, 'Runs the statement on this sample only: nothing is published, no counter moves. '
          + 'An empty topic is the FROM\'s filter, if it has no wildcard.')),
      result);
    return {
      el,
      load(statement) {
        sql.value = statement;
        result.hidden = true;
        el.scrollIntoView({ block: 'start' });
        sql.focus();
      },
    };
  }

  function rules(view) {
    const rulesBox = h('div', { 'data-testid': 'rules-table' });
    const sinksBox = h('div', { 'data-testid': 'sinks-table' });
    const tester = ruleTester();
    view.append(pageHeader('Rules'), rulesBox, h('h2', {}, 'Sinks'), sinksBox, h('h2', {}, 'Test a rule'), tester.el);

    const ruleColumns = [
      { label: 'Name', cell: (r) => r.name },
      { label: 'SQL', class: 'sql', cell: (r) => h('code', {}, r.sql) },
      { label: 'Actions', cell: (r) => h('span', {}, r.actions.map((a) => h('span', { class: 'badge' }, fmtValue(a)))) },
      { label: 'Matched', class: 'num', cell: (r) => counter(`rule-matched-${r.name}`, r.matched) },
      { label: 'Passed', class: 'num', cell: (r) => counter(`rule-passed-${r.name}`, r.passed) },
      { label: 'Failed', class: 'num', cell: (r) => counter(`rule-failed-${r.name}`, r.failed) },
      {
        label: 'Last error', class: 'last-error',
        cell: (r) => (r.last_error ? h('span', { class: 'error-text', 'data-testid': `rule-error-${r.name}` }, r.last_error) : null),
      },
      {
        label: '', class: 'actions',
        cell: (r) => h('button', { type: 'button', 'data-testid': `test-rule-${r.name}`, onclick: () => tester.load(r.sql) }, 'Test'),
      },
    ];
    const sinkCounter = (label, key) => ({ label, class: 'num', cell: (s) => counter(`sink-${key}-${s.name}`, s[key]) });
    const sinkColumns = [
      { label: 'Name', cell: (s) => s.name },
      { label: 'Kind', cell: (s) => s.kind },
      {
        label: 'State',
        cell: (s) => h('span', { class: `badge ${s.state === 'up' ? 'on' : 'off'}`, 'data-testid': `sink-state-${s.name}` }, fmtValue(s.state)),
      },
      sinkCounter('Sent', 'sent'), sinkCounter('Retried', 'retried'), sinkCounter('Failed', 'failed'),
      sinkCounter('Dropped', 'dropped'), sinkCounter('In flight', 'inflight'), sinkCounter('Queued', 'queued'),
    ];
    const poller = every(3000, async () => {
      const [ruleList, sinkList] = await Promise.all([api('/rules'), api('/sinks')]);
      clearError();
      swap(rulesBox, JSON.stringify(ruleList), () => table(ruleColumns, ruleList.data, (r) => ({ 'data-testid': `rules-row-${r.name}` }),
        'No rules are configured ([[rules]] in the configuration).'));
      swap(sinksBox, JSON.stringify(sinkList), () => table(sinkColumns, sinkList.data, (s) => ({ 'data-testid': `sinks-row-${s.name}` }),
        'No sinks are configured ([[sinks]] in the configuration).'));
    });
    return poller;
  }

  // ---- routing ----------------------------------------------------------------------------

  const ROUTES = { overview, clients, subscriptions, retained, listeners, nodes, bridges, rules };
  let current = null;

  function render() {
    const hash = location.hash.replace(/^#\/?/, '');
    const [name, ...rest] = hash.split('/');
    const arg = rest.join('/');
    if (!ROUTES[name]) {
      location.replace('#/overview');
      return;
    }
    if (current) current.stop();
    clearError();
    const view = byId('view');
    view.replaceChildren();
    view.dataset.page = arg && name === 'clients' ? 'client' : name;
    for (const a of document.querySelectorAll('nav a')) {
      a.classList.toggle('active', a.dataset.route === name);
    }
    let label = name;
    if (name === 'clients' && arg) {
      let id = arg;
      try {
        id = decodeURIComponent(arg);
      } catch (_) { /* shown as written */ }
      current = clientDetail(view, id);
      label = `client ${id}`;
    } else {
      current = ROUTES[name](view);
    }
    document.title = `Braid · ${label}`;
  }

  window.addEventListener('hashchange', render);
  document.addEventListener('DOMContentLoaded', () => {
    setupKeyPrompt();
    render();
  });
})();
