// Drives Braid's web dashboard in headless Chromium (Debian's /usr/bin/chromium, through
// playwright-core) for tests/interop/test_dashboard.py, one step at a time:
//
//   node dashboard.mjs BASE_URL ARTIFACT_DIR [PREFIX]
//
// It reads one JSON command per line on stdin and answers each with one JSON line on stdout:
// {"ok": true, "value": ...} or {"ok": false, "error": "..."}; the first line it prints,
// {"ok": true, "value": "ready"}, says the browser is up. Elements are named by their
// data-testid. Commands ({"op": ..., ...}; timeouts in ms, 5000 unless given):
//
//   goto {path}                        load BASE_URL + path (e.g. "/#/overview")
//   route {hash}                       set location.hash (e.g. "#/clients")
//   text {testid}                      the element's text, once it is visible
//   wait_text {testid, equals | not | matches | number_above}
//                                      waits until its text fits, answers the text
//   wait_visible {testid} / wait_hidden {testid}  (hidden also means absent)
//   wait_js {fn, arg}                  waits until the page function `fn`(arg) is truthy
//   attr {testid, name}                an attribute (null if absent)
//   count {testid}                     how many elements carry that data-testid
//   click {testid} / fill {testid, value}
//   screenshot {name}                  full page PNG, ARTIFACT_DIR/PREFIX-name.png: its path
//   dialogs                            the messages of the dialogs accepted so far
//   errors                             uncaught page errors and console errors so far
//   close                              closes the browser and exits
//
// window.confirm dialogs are accepted.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { chromium } from 'playwright-core';

const [base, artifactDir, prefix = 'dashboard'] = process.argv.slice(2);
if (!base || !artifactDir) {
  console.error('usage: node dashboard.mjs BASE_URL ARTIFACT_DIR [PREFIX]');
  process.exit(2);
}
fs.mkdirSync(artifactDir, { recursive: true });

const reply = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);

const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'braid-dashboard-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1280, height: 860 },
  colorScheme: 'light',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = context.pages()[0] || await context.newPage();
const pageErrors = [];
const consoleErrors = [];
const dialogs = [];
page.on('pageerror', (e) => pageErrors.push(String(e && e.stack || e)));
page.on('console', (m) => {
  if (m.type() === 'error') consoleErrors.push(m.text());
});
page.on('dialog', async (d) => {
  dialogs.push(d.message());
  await d.accept();
});

const byTestId = (id) => page.getByTestId(id);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function fits(text, cmd) {
  const t = (text || '').trim();
  if ('equals' in cmd) return t === String(cmd.equals);
  if ('not' in cmd) return t !== String(cmd.not);
  if ('matches' in cmd) return new RegExp(cmd.matches).test(t);
  if ('number_above' in cmd) {
    const n = Number(t.replace(/,/g, ''));
    return Number.isFinite(n) && t !== '' && n > cmd.number_above;
  }
  return t !== '';
}

async function waitText(cmd, timeout) {
  const deadline = Date.now() + timeout;
  let last = null;
  for (;;) {
    const loc = byTestId(cmd.testid);
    if (await loc.count() === 1) {
      last = await loc.textContent({ timeout: 1000 }).catch(() => null);
      if (last !== null && fits(last, cmd)) return last.trim();
    }
    if (Date.now() > deadline) {
      throw new Error(`data-testid=${cmd.testid}: text ${JSON.stringify(last)} still does not fit `
        + `${JSON.stringify(cmd)} after ${timeout} ms`);
    }
    await sleep(100);
  }
}

async function run(cmd) {
  const timeout = cmd.timeout ?? 5000;
  switch (cmd.op) {
    case 'goto':
      await page.goto(base + (cmd.path || '/'), { waitUntil: 'load', timeout });
      return page.url();
    case 'route':
      await page.evaluate((h) => { location.hash = h; }, cmd.hash);
      return page.url();
    case 'text':
      await byTestId(cmd.testid).waitFor({ state: 'visible', timeout });
      return (await byTestId(cmd.testid).textContent()).trim();
    case 'wait_text':
      return waitText(cmd, timeout);
    case 'wait_visible':
      await byTestId(cmd.testid).waitFor({ state: 'visible', timeout });
      return true;
    case 'wait_hidden':
      await byTestId(cmd.testid).waitFor({ state: 'hidden', timeout });
      return true;
    case 'wait_js':
      // A string is evaluated as an expression: the call of `fn` on `arg`, inlined as JSON.
      await page.waitForFunction(`(${cmd.fn})(${JSON.stringify(cmd.arg ?? null)})`, null, { timeout, polling: 100 });
      return true;
    case 'attr':
      return byTestId(cmd.testid).getAttribute(cmd.name, { timeout });
    case 'count':
      return byTestId(cmd.testid).count();
    case 'click':
      await byTestId(cmd.testid).click({ timeout });
      return true;
    case 'fill':
      await byTestId(cmd.testid).fill(cmd.value, { timeout });
      return true;
    case 'screenshot': {
      const file = path.join(artifactDir, `${prefix}-${cmd.name}.png`);
      await page.screenshot({ path: file, fullPage: true, timeout });
      return file;
    }
    case 'dialogs':
      return dialogs;
    case 'errors':
      return { page: pageErrors, console: consoleErrors };
    default:
      throw new Error(`unknown op ${JSON.stringify(cmd.op)}`);
  }
}

async function close() {
  await context.close().catch(() => {});
  fs.rmSync(profile, { recursive: true, force: true });
}

reply({ ok: true, value: 'ready' });
const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch (e) {
    reply({ ok: false, error: `not JSON: ${e.message}` });
    continue;
  }
  if (cmd.op === 'close') break;
  try {
    reply({ ok: true, value: await run(cmd) });
  } catch (e) {
    reply({ ok: false, error: String(e && e.message || e) });
  }
}
await close();
reply({ ok: true, value: 'closed' });
process.exit(0);
