// What the end-to-end scripts share: the request channel to the Rust test driving them (a line
// `REQ <json>` on stdout gets one line `RES <json>` on stdin; tests/src/browser.rs answers), and
// a scenario runner that launches Debian's Chromium, fails on any console error, saves a
// screenshot on failure and prints `E2E OK` when the scenario passes.
//
// Environment: SHOT_DIR (screenshots), CHROMIUM (default /usr/bin/chromium).

import { createInterface } from 'node:readline';
import { mkdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';
import jsQR from 'jsqr';

const SHOT_DIR = process.env.SHOT_DIR || '';
const TIMEOUT = 20_000;

/** A required environment variable. */
export function env(k) {
  const v = process.env[k];
  if (!v) throw new Error(`missing ${k}`);
  return v;
}

const lines = createInterface({ input: process.stdin });
const pending = [];
lines.on('line', (l) => {
  if (!l.startsWith('RES ')) return;
  const next = pending.shift();
  if (next) next(JSON.parse(l.slice(4)));
});

/** Asks the Rust test to act (as another party); resolves with its answer. */
export function driver(req) {
  return new Promise((resolve, reject) => {
    pending.push((res) => (res.error ? reject(new Error(`driver: ${res.error}`)) : resolve(res.ok)));
    process.stdout.write(`REQ ${JSON.stringify(req)}\n`);
  });
}

export function step(name) {
  process.stderr.write(`e2e: ${name}\n`);
}

export function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}

/** axe-core, the accessibility checker (a tool we did not write), evaluated into the page. */
const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/**
 * Fails on any WCAG 2.1 A/AA violation axe-core finds on the page as it is now (labels, names,
 * roles, contrast, landmarks...). Runs through DevTools, so the page's CSP does not stand in its
 * way and the page itself is unchanged.
 */
export async function audit(page, where) {
  const found = await page.evaluate(`(() => {
    if (typeof window.axe === 'undefined') { ${AXE} }
    return window.axe
      .run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } })
      .then((r) => r.violations.map((v) => ({
        id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' ')),
      })));
  })()`);
  assert(found.length === 0, `accessibility on ${where} (axe-core, WCAG 2.1 A/AA): ${JSON.stringify(found)}`);
}

/** Saves a screenshot of the page as it is now, and audits it (every screen shown is checked). */
export async function shot(page, name) {
  await audit(page, name);
  if (!SHOT_DIR) return;
  mkdirSync(SHOT_DIR, { recursive: true });
  await page.screenshot({ path: `${SHOT_DIR}/${name}.png`, fullPage: true });
}

/**
 * The text of the QR code shown by the `img` at `locator`, decoded by jsQR (a decoder we did not
 * write): the page draws the image on a white canvas at 4x and hands the pixels over.
 */
export async function readQr(locator) {
  const { w, h, px } = await locator.evaluate((img) => {
    const w = img.naturalWidth * 4;
    const h = img.naturalHeight * 4;
    const c = document.createElement('canvas');
    c.width = w;
    c.height = h;
    const g = c.getContext('2d');
    g.fillStyle = '#fff';
    g.fillRect(0, 0, w, h);
    g.imageSmoothingEnabled = false;
    g.drawImage(img, 0, 0, w, h);
    return { w, h, px: Array.from(g.getImageData(0, 0, w, h).data) };
  });
  const code = jsQR(Uint8ClampedArray.from(px), w, h);
  return code ? code.data : null;
}

/**
 * On the Groups screen: starts a group session if there is none, makes a new group, waits for
 * its invite link's countdown and returns the link.
 */
export async function newGroupInvite(page) {
  await nav(page, 'Groups').click();
  await page.getByRole('heading', { name: 'Groups' }).waitFor();
  const startSession = page.getByRole('button', { name: 'Start a group session' });
  if (await startSession.count()) await startSession.click();
  await page.getByRole('button', { name: 'New group and invite link' }).click();
  await page.getByText(/expires in \d+:\d\d/).waitFor();
  return (await page.getByRole('region', { name: 'Invite link' }).locator('code').textContent()).trim();
}

/** Whether the page scrolls sideways (it must not, at any width). */
export async function scrollsSideways(page) {
  return page.evaluate(() => document.documentElement.scrollWidth > document.documentElement.clientWidth + 1);
}

/**
 * Whether the element at `locator` is wholly inside the viewport, waiting up to `timeoutMs` for
 * the layout to settle (a screen just opened may still be scrolling to its newest message).
 */
export async function inViewport(locator, timeoutMs = 3000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const inside = await locator.evaluate((el) => {
      const r = el.getBoundingClientRect();
      return r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight + 1 && r.right <= innerWidth + 1 && r.height > 0;
    });
    if (inside || Date.now() > deadline) return inside;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A link of the main navigation (its name may carry a count: "Chats (2 unread)"). */
export function nav(page, name) {
  const esc = name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: new RegExp(`^${esc}( \\(.*\\))?$`) });
}

/** Runs `body({ browser, page })` in a fresh headless Chromium page. */
export async function scenario(body) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  let page;
  try {
    page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    page.setDefaultTimeout(TIMEOUT);
    const consoleErrors = [];
    // Network statuses are asserted where they matter (e.g. a 400 `not_initialized` before first
    // run and a deliberate 409 `key_changed` are expected); anything else logged as an error is not.
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) consoleErrors.push(m.text());
    });
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    await body({ browser, page });
    assert(consoleErrors.length === 0, `no console errors: ${consoleErrors.join(' | ')}`);
    step('all passed');
    process.stdout.write('E2E OK\n');
  } catch (e) {
    if (page) await shot(page, 'failure').catch(() => {});
    process.stderr.write(`e2e failed: ${e.stack || e}\n`);
    process.exitCode = 1;
  } finally {
    await browser.close();
    lines.close();
  }
}
