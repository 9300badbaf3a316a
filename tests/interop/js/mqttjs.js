// MQTT.js against a broker, from Node or from a page in headless Chromium.
//
//   node mqttjs.js node    URL TOPIC [CA_FILE]   (MQTT.js in Node; CA_FILE for wss://)
//   node mqttjs.js browser URL TOPIC             (MQTT.js's browser bundle in a Chromium page)
//
// Either way the client subscribes to TOPIC/#, publishes a small and a 200 KB message to
// TOPIC/echo (QoS 1) and waits for both to come back, then publishes "from mqtt.js" to
// TOPIC/out for the test to see with another client, and prints one JSON line:
// {"ok": true, "received": [[topic, length], ...]} (or {"ok": false, "error": ...}).
'use strict';
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');

const [mode, url, topic, caFile] = process.argv.slice(2);

// The same session script runs in Node and, serialized, in the page.
function session(mqtt, url, topic, options) {
  return new Promise((resolve) => {
    const big = 'x'.repeat(200 * 1024);
    const received = [];
    const client = mqtt.connect(url, { protocolVersion: 5, clean: true, reconnectPeriod: 0, connectTimeout: 5000, ...options });
    const fail = (e) => { client.end(true); resolve({ ok: false, error: String(e && e.message || e) }); };
    client.on('error', fail);
    client.on('connect', () => {
      client.subscribe(topic + '/echo', { qos: 1 }, (err) => {
        if (err) return fail(err);
        client.publish(topic + '/echo', 'hello', { qos: 1 });
        client.publish(topic + '/echo', big, { qos: 1 });
      });
    });
    client.on('message', (t, payload) => {
      received.push([t, payload.length]);
      if (received.length === 2) {
        client.publish(topic + '/out', 'from mqtt.js', { qos: 1 }, () => {
          client.end(false, () => resolve({ ok: true, received }));
        });
      }
    });
  });
}

async function inNode() {
  const mqtt = require('mqtt');
  const options = caFile ? { ca: fs.readFileSync(caFile), rejectUnauthorized: true } : {};
  return session(mqtt, url, topic, options);
}

async function inBrowser() {
  const { chromium } = require('playwright-core');
  const bundle = fs.readFileSync(path.join(__dirname, 'node_modules', 'mqtt', 'dist', 'mqtt.min.js'));
  const page = '<!doctype html><title>braid</title><script src="/mqtt.min.js"></script>';
  const server = http.createServer((req, res) => {
    if (req.url === '/mqtt.min.js') {
      res.writeHead(200, { 'content-type': 'application/javascript' });
      res.end(bundle);
    } else {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end(page);
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'braid-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    // The test broker's certificate comes from a throwaway CA the browser does not know.
    ignoreHTTPSErrors: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--ignore-certificate-errors'],
  });
  try {
    const tab = await context.newPage();
    await tab.goto(`http://127.0.0.1:${server.address().port}/`);
    const fn = `(${session.toString()})(window.mqtt, ${JSON.stringify(url)}, ${JSON.stringify(topic)}, {})`;
    return await tab.evaluate(fn);
  } finally {
    await context.close();
    server.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

const timer = setTimeout(() => { console.log(JSON.stringify({ ok: false, error: 'timed out' })); process.exit(1); }, 30000);
(mode === 'browser' ? inBrowser() : inNode())
  .then((result) => { console.log(JSON.stringify(result)); clearTimeout(timer); process.exit(result.ok ? 0 : 1); })
  .catch((e) => { console.log(JSON.stringify({ ok: false, error: String(e && e.stack || e) })); process.exit(1); });
