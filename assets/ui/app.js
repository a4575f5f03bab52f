// The live map page's entry point: loads the config and the offline base layer, then keeps four
// things current — fences (GET /v1/fences every FENCE_POLL_MS, redrawn only when they changed),
// devices, their recent tracks and the per-fence inside counters (GET /v1/devices, all pages,
// about every second), the event feed (WebSocket /v1/events/ws), and the header's
// clock/watermark (GET /readyz) — and wires clicks on fences, devices and feed rows to the
// details panel, which refreshes the selection every DETAILS_POLL_MS (a fence's occupancy from
// GET /v1/fences/{id} and /devices, a device from GET /v1/devices/{id}).

import { ApiError, getJson, hasKey, initAuth } from './api.js';
import { EventMemory, EventStream, Feed } from './feed.js';
import { MAX_DRAWN_DEVICES, MapView } from './map.js';
import { Details, FenceList } from './panels.js';
import { Tracks } from './track.js';
import { fenceColour, fmtTime, sleep, throttle } from './util.js';

const DEVICE_PAGE = 10000; // the largest page GET /v1/devices answers
const DEVICE_POLL_MS = 1000;
/** The scan stops here (memory bound); the header says so. */
const MAX_DEVICES_SCANNED = 200000;
const FENCE_POLL_MS = 5000;
const STATUS_POLL_MS = 2000;
const DETAILS_POLL_MS = 2000;
/** Page length asked of GET /v1/fences/{id}/devices. */
const OCCUPANT_PAGE = 1000;
/** A fence's occupants read per refresh, at most (the details show MAX_SHOWN_OCCUPANTS). */
const MAX_OCCUPANTS_READ = 2000;

const $ = (id) => document.getElementById(id);

const state = {
  fences: [],
  fenceById: new Map(),
  fenceSig: '',
  devices: [],
  /** fence id -> devices inside it (from the device scan; the list's and labels' counters) */
  counts: new Map(),
  selection: null,
  devicesTruncated: false,
  /** The last GET /readyz answer: clock and watermark. */
  status: null,
};

// ---- banner (errors the operator should see) -------------------------------------------------

const banners = new Map();
function setBanner(source, text, level = 'warn') {
  if (text) banners.set(source, { text, level });
  else banners.delete(source);
  const b = $('banner');
  const all = [...banners.values()];
  b.hidden = all.length === 0;
  b.textContent = all.map((x) => x.text).join(' · ');
  b.dataset.level = all.some((x) => x.level === 'error') ? 'error' : 'warn';
}

function describe(e) {
  if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
    return hasKey()
      ? `The server refused the API key (${e.message}). Reopen the page with ?key=YOUR_KEY (a key with the read scope).`
      : `The server needs an API key (${e.message}). Open the page with ?key=YOUR_KEY (a key with the read scope).`;
  }
  return e.message;
}

/**
 * Runs `fn` forever, every `ms` (or what it returns), reporting failures under `source`.
 * `open`: the endpoint needs no key, so its success says nothing about the key.
 */
async function every(source, ms, fn, { open = false } = {}) {
  for (;;) {
    let wait = ms;
    try {
      const r = await fn();
      if (typeof r === 'number') wait = r;
      setBanner(source, null);
      if (!open) setBanner('auth', null);
    } catch (e) {
      // A refused key fails every loop alike: one banner says so, not one per loop.
      const refused = e instanceof ApiError && (e.status === 401 || e.status === 403);
      if (refused) setBanner('auth', describe(e), 'error');
      else setBanner(source, `${source}: ${describe(e)}`, 'error');
      wait = Math.max(ms, 3000);
    }
    await sleep(wait);
  }
}

// ---- start ------------------------------------------------------------------------------------

initAuth();
let config = {};
try {
  config = await getJson('/ui/config.json');
} catch (e) {
  setBanner('config', `config: ${describe(e)}`, 'error');
}

const mapView = new MapView($('map'), config, {
  onFence: (id) => select('fence', id),
  onDevice: (id) => select('device', id),
});
const fenceList = new FenceList(
  { list: $('fence-list'), filter: $('fence-filter'), empty: $('fence-empty'), more: $('fence-more'), count: $('fence-count') },
  (kind, id) => select(kind, id, { pan: true }),
);
const details = new Details(
  { panel: $('details'), title: $('details-title'), body: $('details-body'), close: $('details-close') },
  (kind, id) => select(kind, id, { pan: true }),
  () => select(null, null),
);
const memory = new EventMemory();
const tracks = new Tracks();
const feed = new Feed($('feed'), $('feed-empty'), $('feed-count'), (kind, id) => select(kind, id, { pan: true }));

// ---- selection and details --------------------------------------------------------------------

let detailsSig = '';
function select(kind, id, { pan = false } = {}) {
  state.selection = kind ? { kind, id } : null;
  mapView.select(kind, id);
  fenceList.select(kind === 'fence' ? id : null);
  tracks.select(kind === 'device' ? id : null);
  drawTrack();
  detailsSig = '';
  if (!kind) {
    details.hide();
    return;
  }
  if (pan) {
    if (kind === 'fence') mapView.showFence(id);
    else mapView.showDevice(id);
  }
  renderDetails();
}

/** The selected device's track on the map (none when no device is selected). */
function drawTrack() {
  const sel = state.selection;
  const id = sel?.kind === 'device' ? sel.id : null;
  mapView.setTrack(id, id === null ? null : tracks.points(id));
}

/**
 * What "time inside" is counted to: with the event clock the watermark (event time stands still
 * while no fixes come), with the live clock now.
 */
function timeReference() {
  const clock = state.status?.clock ?? config.clock ?? 'live';
  if (clock === 'event') {
    const w = state.status?.watermark ?? null;
    return { ms: w ? Date.parse(w) : null, clock, watermark: w };
  }
  return { ms: Date.now(), clock, watermark: null };
}

/** A fence's occupancy: its `inside` count and (up to MAX_OCCUPANTS_READ of) its occupants. */
async function loadOccupancy(id) {
  const path = `/v1/fences/${encodeURIComponent(id)}`;
  const readOccupants = async () => {
    const list = [];
    let after = null;
    do {
      const page = await getJson(`${path}/devices`, { limit: OCCUPANT_PAGE, after });
      for (const o of page.devices) list.push(o);
      after = page.next_after ?? null;
    } while (after !== null && list.length < MAX_OCCUPANTS_READ);
    return { list, complete: after === null };
  };
  try {
    const [fence, { list, complete }] = await Promise.all([getJson(path), readOccupants()]);
    return { missing: false, error: null, fence, inside: fence.inside ?? null, occupants: list, complete };
  } catch (e) {
    const missing = e instanceof ApiError && e.status === 404;
    return { missing, error: missing ? null : `Cannot read the devices inside: ${describe(e)}`,
      fence: null, inside: null, occupants: [], complete: false };
  }
}

/** The last occupancy read, {id, occ}: events re-render with it; the details loop reads anew. */
let occupancy = null;

/**
 * Renders the details of the selection. `fetch`: read a fence's occupancy again (a device is
 * always read: one small request).
 */
async function renderDetails({ fetch = true } = {}) {
  const sel = state.selection;
  if (!sel) return;
  if (sel.kind === 'fence') {
    if (fetch || occupancy?.id !== sel.id) {
      const occ = await loadOccupancy(sel.id);
      if (state.selection !== sel) return; // the selection moved on while we waited
      occupancy = { id: sel.id, occ };
    }
    const { occ } = occupancy;
    const feature = occ.fence ?? state.fenceById.get(sel.id)?.feature;
    const events = memory.recent({ fence: sel.id });
    const ref = timeReference();
    const sig = JSON.stringify([sel, occ, feature, ref, events.length && events[0].seq]);
    if (sig === detailsSig) return;
    detailsSig = sig;
    details.showFence(sel.id, feature, occ, events, ref);
    return;
  }
  let device = null;
  let error = null;
  try {
    device = await getJson(`/v1/devices/${encodeURIComponent(sel.id)}`);
  } catch (e) {
    error = e instanceof ApiError && e.status === 404
      ? 'The server holds no state for this device (no fix seen, or an unknown id).'
      : `Cannot read the device: ${describe(e)}`;
  }
  if (state.selection !== sel) return; // the selection moved on while we waited
  const pos = device?.last_position;
  if (pos && tracks.add(sel.id, pos.lat, pos.lon, device.last_fix_at)) drawTrack();
  const events = memory.recent({ device: sel.id });
  const sig = JSON.stringify([sel, device, error, events.length && events[0].seq]);
  if (sig === detailsSig) return;
  detailsSig = sig;
  details.showDevice(sel.id, device, events, error);
}
// On events and fence changes: a device is read again, a fence re-rendered with its last
// occupancy (the details loop reads that every DETAILS_POLL_MS; a busy fence's events must not
// multiply the reads).
const renderDetailsSoon = throttle(() => renderDetails({ fetch: state.selection?.kind === 'device' }), 300);

// ---- fences -----------------------------------------------------------------------------------

async function loadFences() {
  // Paged like every list: follow next_after to the end.
  const features = [];
  let after = null;
  do {
    const page = await getJson('/v1/fences', { limit: 10000, after });
    for (const f of page.features || []) features.push(f);
    after = page.next_after;
  } while (after);
  const sig = JSON.stringify(features);
  if (sig === state.fenceSig) return;
  state.fenceSig = sig;
  state.fences = features
    .map((f) => ({ id: String(f.id), feature: f, colour: fenceColour(String(f.id)) }))
    .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  state.fenceById = new Map(state.fences.map((f) => [f.id, f]));
  mapView.setFences(state.fences);
  fenceList.setFences(state.fences);
  mapView.setCounts(state.counts);
  fenceList.setCounts(state.counts);
  renderDetailsSoon();
  updateMapNote();
}
/** An event or device names a fence we have not drawn: fetch fences now rather than in 5 s. */
const loadFencesSoon = throttle(() => loadFences().catch(() => {}), 1000);

// ---- devices and counters ---------------------------------------------------------------------

async function scanDevices() {
  const started = performance.now();
  const all = [];
  let after = null;
  let truncated = false;
  do {
    const page = await getJson('/v1/devices', { limit: DEVICE_PAGE, after });
    for (const d of page.devices) all.push(d);
    after = page.next_after ?? null;
    if (after !== null && all.length >= MAX_DEVICES_SCANNED) {
      truncated = true;
      break;
    }
  } while (after !== null);

  const counts = new Map();
  let unknownFence = false;
  for (const d of all) {
    for (const f of d.inside || []) {
      counts.set(f, (counts.get(f) || 0) + 1);
      if (!state.fenceById.has(f)) unknownFence = true;
    }
  }
  state.devices = all;
  state.devicesTruncated = truncated;
  state.counts = counts;
  tracks.record(all);
  drawTrack();
  if (unknownFence) loadFencesSoon();

  mapView.setDevices(all);
  mapView.setCounts(state.counts);
  fenceList.setCounts(state.counts);
  updateMapNote();
  // A big fleet takes a while to list; never spend more than half the time listing.
  return Math.max(DEVICE_POLL_MS, 2 * (performance.now() - started));
}

function updateMapNote() {
  const s = mapView.lastStats;
  const n = state.devices.length;
  const parts = [`${n}${state.devicesTruncated ? '+' : ''} device${n === 1 ? '' : 's'}`];
  if (s.located < n) parts.push(`${n - s.located} without position`);
  $('device-count').textContent = parts.join(' · ');
  const note = $('map-note');
  if (s.capped) {
    note.hidden = false;
    note.textContent = `Drawing ${s.drawn} of ${s.located} devices (at most ${MAX_DRAWN_DEVICES}: in view, inside a fence first); zoom in to see others.`;
  } else if (state.devicesTruncated) {
    note.hidden = false;
    note.textContent = `Only the first ${MAX_DEVICES_SCANNED} devices are listed; counters cover those.`;
  } else if (state.fences.length === 0 && s.located === 0) {
    note.hidden = false;
    note.textContent = 'No fences and no device positions yet.';
  } else {
    note.hidden = true;
  }
}

// ---- server status ----------------------------------------------------------------------------

async function loadStatus() {
  const r = await getJson('/readyz');
  state.status = r;
  const w = r.watermark ? fmtTime(r.watermark) : 'none yet';
  $('clock').textContent = `${r.clock} clock · watermark ${w}`;
  $('clock').title = `watermark ${r.watermark ?? 'none'} · lateness ${r.lateness_ms} ms · ${r.shards} shards`;
}

// ---- events -----------------------------------------------------------------------------------

const stream = new EventStream({
  onEvent: (e) => {
    memory.add(e);
    feed.add(e);
    if (!state.fenceById.has(e.fence)) loadFencesSoon();
    const sel = state.selection;
    if (sel && ((sel.kind === 'fence' && sel.id === e.fence) || (sel.kind === 'device' && sel.id === e.device))) {
      renderDetailsSoon();
    }
  },
  onNote: (text) => feed.note(text),
  onState: (s, detail) => {
    const c = $('conn');
    c.dataset.state = s;
    c.textContent = { live: 'live', connecting: 'connecting…', down: 'disconnected' }[s];
    c.title = detail || 'event subscription';
  },
});

$('find-device').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const id = $('find-device-input').value.trim();
  if (id) select('device', id, { pan: true });
});

// Hooks for the browser test (tests/browser/map.mjs) and for poking around in devtools.
window.__geodwell = {
  devicePoint: (id) => mapView.devicePagePoint(id),
  stats: () => ({ ...mapView.lastStats, fences: state.fences.length }),
  map: mapView.map,
  track: (id) => tracks.points(id),
};

// The offline base layer (1.3 MB, cached by ETag): the map works without it.
mapView.loadBase().catch((e) => setBanner('base', `base map: ${describe(e)}`, 'warn'));

every('fences', FENCE_POLL_MS, loadFences);
every('devices', DEVICE_POLL_MS, scanDevices);
every('status', STATUS_POLL_MS, loadStatus, { open: true });
// Open: with nothing selected it makes no request, so its success says nothing about the key
// (counted as proof of one, it cleared the "needs an API key" banner it had not earned); and
// renderDetails shows its own errors in the panel.
every('details', DETAILS_POLL_MS, async () => {
  if (state.selection) await renderDetails();
}, { open: true });
stream.start();
