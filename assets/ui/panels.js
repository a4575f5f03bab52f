// The fence list (legend with dwell thresholds and inside counters) and the details panel: a
// fence's settings, its occupancy (the devices inside with their time since ENTER and progress
// toward the next dwell threshold) and recent events; a device's pairs and recent events.

import { eventRow } from './feed.js';
import { el, fmtDur, fmtTime, fmtValue, parseDur } from './util.js';

// A radius for people: whole metres below 10 km, else km with one decimal.
function metres(m) {
  const v = Number(m);
  if (!Number.isFinite(v)) return `${m} m`;
  return v < 10000 ? `${Math.round(v)} m` : `${(v / 1000).toFixed(1)} km`;
}

/** Fence rows rendered at once; the filter box narrows a longer list. */
export const MAX_LISTED_FENCES = 500;
/** Occupants shown in a fence's details (the longest inside first). */
export const MAX_SHOWN_OCCUPANTS = 200;

/** The left-hand fence list. Rows are rebuilt when fences or the filter change; counters in place. */
export class FenceList {
  constructor({ list, filter, empty, more, count }, onSelect) {
    this.list = list;
    this.filterEl = filter;
    this.emptyEl = empty;
    this.moreEl = more;
    this.countEl = count;
    this.onSelect = onSelect;
    this.fences = [];
    this.rows = new Map();
    this.counts = new Map();
    this.selected = null;
    filter.addEventListener('input', () => this.render());
  }

  /** @param {Array<{id: string, feature: object, colour: string}>} fences sorted by id */
  setFences(fences) {
    this.fences = fences;
    this.render();
  }

  render() {
    const q = this.filterEl.value.trim().toLowerCase();
    const matching = q
      ? this.fences.filter((f) => f.id.toLowerCase().includes(q)
        || String(f.feature.properties?.name ?? '').toLowerCase().includes(q))
      : this.fences;
    const shown = matching.slice(0, MAX_LISTED_FENCES);
    this.rows.clear();
    this.list.replaceChildren(...shown.map((f) => this.row(f)));
    this.emptyEl.hidden = this.fences.length > 0;
    this.countEl.textContent = this.fences.length ? `(${this.fences.length})` : '';
    this.moreEl.hidden = matching.length <= shown.length;
    this.moreEl.textContent = `${matching.length - shown.length} more not listed; type in the filter to narrow.`;
    this.setCounts(this.counts);
  }

  row(f) {
    const p = f.feature.properties || {};
    const dwell = Array.isArray(p.dwell) ? p.dwell : [];
    const inside = el('span', { class: 'inside', title: 'devices inside now', text: '0' });
    const li = el('li', { data: { fence: f.id }, class: f.id === this.selected ? 'selected' : '',
      on: { click: () => this.onSelect('fence', f.id) } },
      el('span', { class: 'swatch' }),
      el('span', {},
        el('div', { class: 'fence-id', text: f.id }),
        p.name ? el('div', { class: 'fence-name', text: p.name }) : null),
      inside,
      el('span', { class: 'thresholds' },
        ...(dwell.length
          ? dwell.map((d) => el('span', { class: 'chip', title: 'dwell threshold', text: `dwell ${d}` }))
          : [el('span', { class: 'chip', text: 'no dwell thresholds' })]),
        p.radius_m !== undefined ? el('span', { class: 'chip', text: `circle ${metres(p.radius_m)}` }) : null));
    // Colours go through the CSSOM: the page's CSP forbids inline style attributes.
    const sw = li.querySelector('.swatch');
    sw.style.borderColor = f.colour;
    sw.style.background = f.colour.replace('hsl(', 'hsla(').replace(')', ', 0.25)');
    this.rows.set(f.id, { li, inside });
    return li;
  }

  /** @param {Map<string, number>} counts devices inside, by fence id */
  setCounts(counts) {
    this.counts = counts;
    for (const [id, r] of this.rows) {
      const n = counts.get(id) || 0;
      const text = String(n);
      if (r.inside.textContent !== text) {
        r.inside.textContent = text;
        r.inside.classList.toggle('nonzero', n > 0);
      }
    }
  }

  select(id) {
    this.selected = id;
    for (const [fid, r] of this.rows) r.li.classList.toggle('selected', fid === id);
  }
}

function kv(pairs) {
  const dl = el('dl', { class: 'kv' });
  for (const [k, v] of pairs) {
    if (v === undefined) continue;
    dl.append(el('dt', { text: k }), el('dd', {}, v instanceof Node ? v : fmtValue(v)));
  }
  return dl;
}

function eventList(events, onSelect, show) {
  if (!events.length) return el('p', { class: 'empty', text: 'No events seen since this page opened.' });
  return el('ol', { class: 'mini-feed' }, ...events.map((e) => eventRow(e, onSelect, show)));
}

/**
 * Where an occupant stands against the fence's dwell thresholds: elapsed since ENTER (ms, up to
 * the reference time; null without one) and the next threshold not yet fired.
 * @param {number[]} thresholds the fence's dwell thresholds, ms, ascending
 * @param {{entered_at: string, dwell_fired?: string[], dwell_waiting_stale?: string[]}} o
 * @param {number|null} refMs the reference time (the watermark, or now)
 */
export function dwellProgress(thresholds, o, refMs) {
  const entered = Date.parse(o.entered_at);
  const elapsed = refMs === null || !Number.isFinite(entered) ? null : Math.max(0, refMs - entered);
  const fired = new Set((o.dwell_fired || []).map(parseDur));
  const stale = new Set((o.dwell_waiting_stale || []).map(parseDur));
  const next = thresholds.find((t) => !fired.has(t));
  return { elapsed, next: next ?? null, stale: next !== undefined && stale.has(next) };
}

/**
 * One occupant: id (a button that selects it), time since ENTER, and a progress bar from ENTER
 * to the next dwell threshold.
 */
function occupantRow(o, thresholds, refMs, onSelect) {
  const { elapsed, next, stale } = dwellProgress(thresholds, o, refMs);
  const bar = el('progress', { class: 'dwell-progress' });
  let label;
  if (!thresholds.length) {
    label = 'no dwell thresholds';
    bar.max = 1;
    bar.value = 0;
  } else if (next === null) {
    label = `all fired (${thresholds.map((t) => fmtDur(t / 1000)).join(', ')})`;
    bar.max = 1;
    bar.value = 1;
    bar.classList.add('done');
  } else {
    bar.max = next;
    bar.value = Math.min(elapsed ?? 0, next);
    const due = elapsed !== null && elapsed >= next;
    label = stale ? `${fmtDur(next / 1000)} due, waiting for a fix`
      : due ? `${fmtDur(next / 1000)} due`
        : `next ${fmtDur(next / 1000)}${elapsed === null ? '' : ` in ${fmtDur((next - elapsed) / 1000)}`}`;
    if (stale || due) bar.classList.add('due');
  }
  bar.title = label;
  return el('li', { class: 'occupant', data: { device: o.device, state: o.state } },
    el('button', { class: 'link occ-id', type: 'button', text: o.device,
      data: { device: o.device }, on: { click: () => onSelect('device', o.device) } }),
    el('span', { class: 'occ-time', text: elapsed === null ? '–' : fmtDur(elapsed / 1000),
      title: `entered ${fmtTime(o.entered_at)}${o.last_fix_at ? ` · last fix ${fmtTime(o.last_fix_at)}` : ''}` }),
    bar,
    el('span', { class: 'occ-next' },
      o.state === 'exiting' ? el('span', { class: 'chip', title: 'an EXIT run is pending', text: 'exiting' }) : null,
      label));
}

/**
 * @param {object} occ the fence's occupancy (see Details.showFence)
 * @param {{ms: number|null, clock: string, watermark: string|null}} ref
 */
function occupancyList(occ, thresholds, ref, onSelect) {
  const t = (o) => Date.parse(o.entered_at) || 0;
  const list = [...occ.occupants].sort((a, b) => t(a) - t(b) || (a.device < b.device ? -1 : a.device > b.device ? 1 : 0));
  const total = Math.max(occ.inside ?? 0, list.length);
  const shown = list.slice(0, MAX_SHOWN_OCCUPANTS);
  const basis = ref.clock === 'event'
    ? `Time inside in event time: from ENTER to the watermark (${ref.watermark ? fmtTime(ref.watermark) : 'none yet'}).`
    : 'Time inside: from ENTER to now.';
  if (!shown.length) return [el('p', { class: 'empty', text: 'No device inside.' })];
  const ul = el('ul', { class: 'occupants' },
    ...shown.map((o) => occupantRow(o, thresholds, ref.ms, onSelect)));
  if (total > shown.length) {
    ul.append(el('li', { class: 'muted', text: `… and ${total - shown.length} more (the ${shown.length} inside longest${
      occ.complete ? '' : ` of the first ${list.length} listed`} are shown)` }));
  }
  return [el('p', { class: 'muted small', text: basis }), ul];
}

/** The details panel for the selected fence or device. */
export class Details {
  constructor({ panel, title, body, close }, onSelect, onClose) {
    this.panel = panel;
    this.title = title;
    this.body = body;
    this.onSelect = onSelect;
    close.addEventListener('click', onClose);
  }

  hide() {
    this.panel.hidden = true;
    this.body.replaceChildren();
  }

  show(kind, id, ...content) {
    this.panel.hidden = false;
    this.panel.dataset.kind = kind;
    this.panel.dataset.id = id;
    this.title.textContent = `${kind === 'fence' ? 'Fence' : 'Device'} ${id}`;
    this.body.replaceChildren(...content);
  }

  /**
   * @param {object|undefined} feature the fence (GET /v1/fences/{id}, else the list's copy)
   * @param {{missing: boolean, error: string|null, inside: number|null, occupants: object[],
   *          complete: boolean}} occ its occupancy: `inside` from GET /v1/fences/{id}, the
   *   occupants from GET /v1/fences/{id}/devices (`complete`: every page was read)
   * @param {object[]} events newest first
   * @param {{ms: number|null, clock: string, watermark: string|null}} ref what "time inside" is
   *   counted to: the watermark with the event clock, now with the live clock
   */
  showFence(id, feature, occ, events, ref) {
    if (occ.missing || !feature) {
      this.show('fence', id, el('p', { class: 'empty', text: 'This fence no longer exists.' }));
      return;
    }
    const p = feature.properties || {};
    const g = feature.geometry || {};
    const thresholds = (Array.isArray(p.dwell) ? p.dwell : []).map(parseDur).filter((t) => t !== null)
      .sort((a, b) => a - b);
    const n = occ.inside ?? occ.occupants.length;
    const shape = g.type === 'Point' ? `circle, radius ${metres(p.radius_m)}` : g.type;
    this.show('fence', id,
      kv([
        ['name', p.name],
        ['shape', shape],
        ['dwell', Array.isArray(p.dwell) && p.dwell.length ? p.dwell.join(', ') : 'none'],
        ['enter / exit confirm', `${p.enter_confirm} / ${p.exit_confirm} fixes`],
        ['confirm within', p.confirm_within],
        ['exit buffer', `${p.exit_buffer_m} m`],
        ['stale after', p.stale_after],
        ['max accuracy', p.max_accuracy_m === 'off' ? 'off' : `${p.max_accuracy_m} m`],
        ['tags', p.tags && Object.keys(p.tags).length ? p.tags : undefined],
      ]),
      el('h3', { text: occ.error ? 'Devices inside' : `Devices inside (${n})` }),
      ...(occ.error ? [el('p', { class: 'empty', text: occ.error })] : occupancyList(occ, thresholds, ref, this.onSelect)),
      el('h3', { text: 'Recent events' }),
      eventList(events, this.onSelect, { device: true, fence: false }));
  }

  /**
   * @param {object|null} device GET /v1/devices/{id}, or null when the server does not know it
   * @param {object[]} events newest first
   * @param {string|null} error why the device could not be read
   */
  showDevice(id, device, events, error) {
    if (!device) {
      this.show('device', id,
        el('p', { class: 'empty', text: error || 'No such device.' }),
        el('h3', { text: 'Recent events' }),
        eventList(events, this.onSelect, { device: false, fence: true }));
      return;
    }
    const pos = device.last_position;
    const pairs = device.pairs || [];
    const table = el('table', { class: 'pairs' },
      el('thead', {}, el('tr', {}, ...['fence', 'state', 'since', 'dwell fired', 'next due'].map((h) => el('th', { text: h })))),
      el('tbody', {}, ...pairs.map((pr) => el('tr', { data: { fence: pr.fence, state: pr.state } },
        el('td', {}, el('button', { class: 'link', type: 'button', text: pr.fence,
          on: { click: () => this.onSelect('fence', pr.fence) } })),
        el('td', { class: `state state-${pr.state}`, text: pr.state,
          title: pr.votes ? `${pr.votes} confirming fix(es) so far` : null }),
        el('td', { text: fmtTime(pr.entered_at), title: pr.entered_at ?? '' }),
        el('td', { text: fmtValue(pr.dwell_fired) }),
        el('td', { text: fmtTime(pr.next_due), title: pr.next_due ?? '' })))));
    this.show('device', id,
      kv([
        ['last fix', fmtTime(device.last_fix_at)],
        ['position', pos ? `${pos.lat.toFixed(6)}, ${pos.lon.toFixed(6)}` : '–'],
        ['buffered fixes', device.buffered],
      ]),
      el('h3', { text: `Pairs (${pairs.length})` }),
      pairs.length ? table : el('p', { class: 'empty', text: 'Not inside or entering any fence.' }),
      el('h3', { text: 'Recent events' }),
      eventList(events, this.onSelect, { device: false, fence: true }));
  }
}
