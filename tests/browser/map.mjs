// Browser test of the live map page: headless Debian Chromium, driven by playwright-core, against
// a running geodwell (started by scripts/browser-test.sh with the event clock and lateness 0, so
// fixes apply at once and dwell deadlines follow the fixes' own timestamps).
//
// It opens the page before any fence exists (the empty state must show, and the offline base
// layer's land and borders must be drawn), then creates fences and sends fixes through the API,
// and checks what a person would see: the fence drawn and listed with its dwell threshold, the
// device marker drawn, ENTER/DWELL/EXIT rows arriving in the feed over the WebSocket, the inside
// counter at 1, the fence's occupancy after clicking it (the device inside, its time since ENTER
// and a progress bar toward the next dwell threshold), the device's pair after clicking its
// marker, and the device's track after it drives on. Every request the page makes must go to the
// server itself (no CDN, no tiles), and the page must log no errors. Two screenshots are saved:
// the fences with the selected device's track, and the region around them (coast and borders).
//
// With API keys on (BROWSER_TEST_ADMIN_KEY and BROWSER_TEST_PAGE_KEY set), it first checks that
// the page without a key loads and says a key is needed, then opens it as /?key=<read-only key>: the key
// must leave the address bar, and everything above must work with it (fetches send it as a
// bearer token, the WebSocket as access_token). The script's own API calls use the admin key.
//
// Environment: GEODWELL_URL (required, e.g. http://127.0.0.1:41234), CHROMIUM (default
// /usr/bin/chromium), SCREENSHOT (default <repo>/target/browser/map.png; the region view goes
// beside it as map-region.png),
// BROWSER_TEST_ADMIN_KEY and BROWSER_TEST_PAGE_KEY (optional, together).
// Exit status: 0 when every check passed; 1 with a message naming the failed check otherwise.

import { mkdirSync, readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '..', '..');
const base = (process.env.GEODWELL_URL || '').replace(/\/$/, '');
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const screenshot = process.env.SCREENSHOT || resolve(repo, 'target/browser/map.png');
const regionShot = screenshot.replace(/\.png$/, '-region.png');
const WAIT_MS = 20000;
const adminKey = process.env.BROWSER_TEST_ADMIN_KEY || '';
const pageKey = process.env.BROWSER_TEST_PAGE_KEY || '';

if (!base) {
  console.error('map.mjs: set GEODWELL_URL to the running server, e.g. http://127.0.0.1:7878');
  process.exit(2);
}

let step = 'start';
const log = (msg) => console.log(`[browser-test] ${msg}`);
function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

async function api(method, path, body, contentType = 'application/json') {
  const headers = body === undefined ? {} : { 'content-type': contentType };
  if (adminKey) headers.authorization = `Bearer ${adminKey}`;
  const res = await fetch(base + path, {
    method,
    headers,
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path} -> ${res.status}: ${text}`);
  return text ? JSON.parse(text) : null;
}

const iso = (ms) => new Date(ms).toISOString();

// A yard fence (polygon, dwell 1m and 10m) and a gate fence (circle) beside the sample fences of
// config/fences.geojson, in Hamburg.
const YARD = 'ui-test-yard';
const GATE = 'ui-test-gate';
const TRUCK = 'truck-ui-1';
const VAN = 'van-ui-2';
const yardFeature = {
  type: 'Feature',
  geometry: { type: 'Polygon', coordinates: [[[9.990, 53.540], [9.996, 53.540], [9.996, 53.544], [9.990, 53.544], [9.990, 53.540]]] },
  properties: { name: 'Browser-test yard', dwell: ['1m', '10m'], tags: { site: 'ui-test' } },
};
const gateFeature = {
  type: 'Feature',
  geometry: { type: 'Point', coordinates: [9.975, 53.546] },
  properties: { name: 'Browser-test gate', radius_m: 150, dwell: ['5m'] },
};

const problems = [];
const offsite = [];
// While the page is deliberately opened without a key, its refused requests are expected.
let expectRefusals = false;
let browser;
try {
  step = 'launch chromium';
  browser = await chromium.launch({
    executablePath,
    headless: true,
    // CI runs as root in a container, where Chromium's sandbox cannot start.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  log(`chromium ${browser.version()} from ${executablePath}`);
  const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    if (expectRefusals && /\b(401|403)\b|WebSocket/.test(m.text())) return;
    problems.push(`console error: ${m.text()}`);
  });
  page.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith(base) && !u.startsWith(base.replace(/^http/, 'ws')) && !u.startsWith('data:')) offsite.push(u);
  });

  if (pageKey) {
    step = 'open the page without a key and see that one is needed';
    expectRefusals = true;
    await page.goto(`${base}/`, { waitUntil: 'load' });
    await page.locator('#banner', { hasText: '?key=' }).waitFor({ state: 'visible', timeout: WAIT_MS });
    // It stays: every poll loop runs at least once more (the details loop, which makes no
    // request with nothing selected, used to clear it after about 2 s).
    for (let i = 0; i < 24; i++) {
      await page.waitForTimeout(250);
      const shown = await page.locator('#banner', { hasText: '?key=' }).isVisible();
      if (!shown) {
        check(false, `the "needs an API key" banner disappeared ${(i + 1) * 250} ms later while no key was given`);
        break;
      }
    }
    log('without a key: the page loads and asks for one, and keeps asking');
  }

  step = 'open the page with no fences';
  await page.goto(pageKey ? `${base}/?key=${encodeURIComponent(pageKey)}` : `${base}/`, { waitUntil: 'load' });
  expectRefusals = false;
  if (pageKey) {
    check(!page.url().includes(pageKey), `the key is still in the address bar: ${page.url()}`);
  }
  await page.locator('#fence-empty').waitFor({ state: 'visible', timeout: WAIT_MS });
  await page.locator('#conn[data-state="live"]').waitFor({ timeout: WAIT_MS });
  log(`page loaded${pageKey ? ' with a read-only key' : ''}: empty fence list shown, event subscription live`);

  step = 'see the offline base layer (land and country borders) drawn';
  // SVG paths in the base pane under everything (one per polygon or border line); their "d"
  // hold the projected outlines of what is in view (the whole world at first).
  await page.waitForFunction(() => ['path.gd-land', 'path.gd-borders'].every((sel) => [
    ...document.querySelectorAll(`.leaflet-gdBase-pane ${sel}`)].reduce((n, p) => n + (p.getAttribute('d') || '').length, 0) > 2000),
  null, { timeout: WAIT_MS });
  log('base layer drawn: land and borders');

  step = 'create fences through the API';
  await api('POST', '/v1/fences', readFileSync(resolve(repo, 'config/fences.geojson'), 'utf8'));
  await api('PUT', `/v1/fences/${YARD}`, yardFeature);
  await api('PUT', `/v1/fences/${GATE}`, gateFeature);

  step = `see fence ${YARD} drawn on the map`;
  await page.locator(`path.gd-fence[data-fence="${YARD}"]`).waitFor({ timeout: WAIT_MS });
  await page.locator(`path.gd-fence[data-fence="${GATE}"]`).waitFor({ timeout: WAIT_MS });
  step = `see fence ${YARD} listed with its dwell threshold`;
  const yardRow = page.locator(`#fence-list li[data-fence="${YARD}"]`);
  await yardRow.waitFor({ timeout: WAIT_MS });
  check((await yardRow.textContent()).includes('dwell 1m'), `fence row lacks "dwell 1m": ${await yardRow.textContent()}`);
  check(await page.locator('#fence-empty').isHidden(), 'the "no fences" note is still shown');
  log('fences drawn and listed');

  step = 'send fixes';
  // The truck drives into the yard and stays 2.5 min (ENTER, then DWELL 1m); the van passes
  // through the gate circle (ENTER, EXIT).
  const t0 = Date.now() - 10 * 60 * 1000;
  await api('POST', '/v1/fixes', [
    { device: TRUCK, lat: 53.5370, lon: 9.9930, ts: iso(t0) },
    { device: VAN, lat: 53.5460, lon: 9.9700, ts: iso(t0) },
    { device: TRUCK, lat: 53.5420, lon: 9.9930, ts: iso(t0 + 30000) },
    { device: VAN, lat: 53.5460, lon: 9.9750, ts: iso(t0 + 30000) },
    { device: TRUCK, lat: 53.5421, lon: 9.9931, ts: iso(t0 + 60000) },
    { device: VAN, lat: 53.5465, lon: 9.9810, ts: iso(t0 + 60000) },
    { device: TRUCK, lat: 53.5422, lon: 9.9933, ts: iso(t0 + 180000) },
  ]);

  step = 'see an ENTER event arrive in the feed';
  await page.locator(`#feed li[data-type="enter"]`, { hasText: TRUCK }).waitFor({ timeout: WAIT_MS });
  step = 'see the DWELL event arrive in the feed';
  await page.locator(`#feed li[data-type="dwell"]`, { hasText: TRUCK }).waitFor({ timeout: WAIT_MS });
  step = 'see the EXIT event arrive in the feed';
  await page.locator(`#feed li[data-type="exit"]`, { hasText: VAN }).waitFor({ timeout: WAIT_MS });
  log('ENTER, DWELL and EXIT rows arrived in the feed');

  step = `see the inside counter of ${YARD} at 1`;
  await page.waitForFunction(
    (id) => document.querySelector(`#fence-list li[data-fence="${id}"] .inside`)?.textContent === '1',
    YARD, { timeout: WAIT_MS });
  const gateCount = await page.locator(`#fence-list li[data-fence="${GATE}"] .inside`).textContent();
  check(gateCount === '0', `${GATE} counter shows ${gateCount}, expected 0 (the van left)`);
  log('inside counters: yard 1, gate 0');

  step = `see the device marker of ${TRUCK} drawn`;
  await page.waitForFunction((id) => window.__geodwell?.devicePoint(id) !== null, TRUCK, { timeout: WAIT_MS });

  step = `click fence ${YARD} in the list and see ${TRUCK} inside it`;
  await yardRow.click();
  const occupant = page.locator(`#details[data-kind="fence"][data-id="${YARD}"] li.occupant[data-device="${TRUCK}"]`);
  await occupant.locator(`button[data-device="${TRUCK}"]`).waitFor({ timeout: WAIT_MS });
  step = `see ${TRUCK}'s time inside ${YARD} and its progress toward the 10m threshold`;
  // ENTER at t0+30s, the watermark at t0+180s (event clock, lateness 0): 2m 30s of 10m, the 1m
  // threshold fired. The bar needs the watermark from /readyz (polled every 2 s).
  await page.waitForFunction((sel) => {
    const bar = document.querySelector(`${sel} progress.dwell-progress`);
    return bar && bar.max === 600000 && bar.value > 0 && bar.value < bar.max;
  }, `#details[data-kind="fence"][data-id="${YARD}"] li.occupant[data-device="${TRUCK}"]`, { timeout: WAIT_MS });
  const occTime = (await occupant.locator('.occ-time').textContent()).trim();
  check(/^\d+m( \d+s)?$/.test(occTime), `time inside shows "${occTime}", expected minutes`);
  const occText = await page.locator('#details-body').textContent();
  check(occText.includes('Devices inside (1)'), `the occupancy heading lacks "Devices inside (1)": ${occText}`);
  check(occText.includes('next 10m'), `the occupant row lacks "next 10m": ${occText}`);
  check(!occText.includes(VAN), `${VAN} is listed inside ${YARD}`);
  log(`occupancy: ${TRUCK} inside ${YARD} for ${occTime}, progress bar toward 10m`);

  step = 'zoom out to the region for the base-layer screenshot';
  await page.evaluate(() => window.__geodwell.map.setView([54.2, 9.9], 6, { animate: false }));
  await page.mouse.move(2, 2);
  await page.waitForTimeout(800);
  mkdirSync(dirname(regionShot), { recursive: true });
  await page.screenshot({ path: regionShot });
  log(`screenshot: ${regionShot}`);
  await yardRow.click();
  // The list click zooms to the fence; let the map settle before clicking a marker.
  await page.waitForTimeout(700);

  step = `click the marker of ${TRUCK} and see its pair with ${YARD}`;
  const pt = await page.evaluate((id) => window.__geodwell.devicePoint(id), TRUCK);
  check(pt, `no marker for ${TRUCK} after zooming to its fence`);
  await page.mouse.click(pt.x, pt.y);
  await page.locator(`#details[data-kind="device"][data-id="${TRUCK}"] tr[data-fence="${YARD}"][data-state="inside"]`).waitFor({ timeout: WAIT_MS });
  log('device details show the pair (inside)');

  step = `drive ${TRUCK} out of the yard and see its track drawn`;
  // One fix at a time, each seen by the page (its device poll) before the next: the track holds
  // what the page saw, about one position a second.
  const drive = [[53.5425, 9.9990], [53.5432, 10.0050], [53.5440, 10.0110], [53.5446, 10.0170]];
  for (const [i, [lat, lon]] of drive.entries()) {
    await api('POST', '/v1/fixes', [{ device: TRUCK, lat, lon, ts: iso(t0 + 200000 + i * 10000) }]);
    await page.waitForFunction(([id, la, lo]) => window.__geodwell.track(id).some(([a, b]) => a === la && b === lo),
      [TRUCK, lat, lon], { timeout: WAIT_MS });
  }
  const track = page.locator(`.leaflet-gdTrack-pane path.gd-track[data-device="${TRUCK}"]`);
  await track.waitFor({ timeout: WAIT_MS });
  await page.waitForFunction((id) => {
    const p = document.querySelector(`path.gd-track[data-device="${id}"]`);
    return p && Number(p.dataset.points) >= 5 && (p.getAttribute('d') || '').length > 10;
  }, TRUCK, { timeout: WAIT_MS });
  log(`track drawn: ${await track.getAttribute('data-points')} positions`);

  step = 'zoom out to every fence for the screenshot';
  await page.evaluate(() => {
    const m = window.__geodwell.map;
    let b = null;
    m.eachLayer((l) => {
      if (l.options && l.options.className === 'gd-fence') b = b ? b.extend(l.getBounds()) : l.getBounds();
    });
    if (b) m.fitBounds(b, { padding: [20, 20], animate: false });
  });
  await page.mouse.move(2, 2); // no hover tooltip in the picture
  await page.waitForTimeout(800);

  step = 'save the screenshot';
  mkdirSync(dirname(screenshot), { recursive: true });
  await page.screenshot({ path: screenshot });
  log(`screenshot: ${screenshot}`);

  step = 'check the page stayed offline and error-free';
  check(offsite.length === 0, `the page requested other origins: ${offsite.join(', ')}`);
  check(problems.length === 0, problems.join('\n'));
  log('ok');
  await browser.close();
  process.exit(0);
} catch (e) {
  console.error(`[browser-test] FAILED at step "${step}": ${e.message}`);
  if (problems.length) console.error(`[browser-test] page problems:\n  ${problems.join('\n  ')}`);
  try {
    const pages = browser ? browser.contexts().flatMap((c) => c.pages()) : [];
    if (pages[0]) {
      const failShot = screenshot.replace(/\.png$/, '-failed.png');
      mkdirSync(dirname(failShot), { recursive: true });
      await pages[0].screenshot({ path: failShot });
      console.error(`[browser-test] screenshot of the failure: ${failShot}`);
    }
  } catch {
    // the browser itself may be what failed
  }
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}
