// Events: the WebSocket subscription (with resume), the scrolling feed, and a bounded memory of
// recent events for the details panel.
//
// The subscription starts BACKLOG events before the log head, so the feed opens with recent
// history rather than empty. Every event's seq is remembered; after a drop the page reconnects
// with from_seq = last seq + 1 (or the server's resume_from after a "lagged" frame), so nothing
// is shown twice and nothing the log still holds is missed. Frames the server sends about the
// stream itself ("gap": the log no longer held what was asked for) become notes in the feed.

import { getJson, openSocket } from './api.js';
import { el, fmtDur, fmtTime } from './util.js';

/** Events replayed on first connect. */
export const BACKLOG = 100;
/** Rows kept in the feed (oldest dropped). */
export const FEED_ROWS = 200;
/** Events remembered for the details panel. */
export const MEMORY = 5000;

/** A WebSocket subscription to /v1/events/ws that reconnects and resumes by seq. */
export class EventStream {
  /**
   * @param {{onEvent: (e: object) => void, onNote: (text: string) => void,
   *          onState: (state: 'connecting'|'live'|'down', detail: string) => void}} handlers
   */
  constructor(handlers) {
    this.h = handlers;
    this.nextSeq = null; // the next seq wanted; null until the first connect decides
    this.backoff = 500;
    this.ws = null;
  }

  async start() {
    try {
      const head = await getJson('/v1/events', { limit: 1 });
      this.nextSeq = Math.max(head.first_seq, head.head_seq - BACKLOG);
    } catch (e) {
      // Without the head the subscription still works; it just starts with new events only.
      this.h.onState('down', `cannot read the event log: ${e.message}`);
    }
    this.connect();
  }

  connect() {
    this.h.onState('connecting', this.nextSeq === null ? '' : `from seq ${this.nextSeq}`);
    const params = this.nextSeq === null ? {} : { from_seq: this.nextSeq };
    const ws = openSocket('/v1/events/ws', params);
    this.ws = ws;
    ws.onopen = () => {
      this.backoff = 500;
      this.h.onState('live', '');
    };
    ws.onmessage = (m) => {
      let e;
      try {
        e = JSON.parse(m.data);
      } catch {
        return;
      }
      if (e.type === 'lagged') {
        this.nextSeq = e.resume_from;
        this.h.onNote(`fell behind the event stream; resuming from seq ${e.resume_from}`);
        return;
      }
      if (e.type === 'gap') {
        this.h.onNote(`events from seq ${e.missing_from} to ${e.resume_from - 1} are no longer held by the server`);
        return;
      }
      if (typeof e.seq !== 'number') return;
      if (this.nextSeq !== null && e.seq < this.nextSeq) return; // already shown before a reconnect
      this.nextSeq = e.seq + 1;
      this.h.onEvent(e);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      const why = ev.reason ? `${ev.code} ${ev.reason}` : `code ${ev.code}`;
      this.h.onState('down', `disconnected (${why}); retrying in ${Math.round(this.backoff / 100) / 10}s`);
      setTimeout(() => this.connect(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, 10000);
    };
  }
}

/** Recent events by fence and device, bounded to MEMORY events in total. */
export class EventMemory {
  constructor() {
    this.events = [];
  }

  add(e) {
    this.events.push(e);
    if (this.events.length > MEMORY * 1.2) this.events.splice(0, this.events.length - MEMORY);
  }

  /** Newest first, at most `n`, matching fence and/or device. */
  recent({ fence, device }, n = 50) {
    const out = [];
    for (let i = this.events.length - 1; i >= 0 && out.length < n; i--) {
      const e = this.events[i];
      if ((fence === undefined || e.fence === fence) && (device === undefined || e.device === device)) {
        out.push(e);
      }
    }
    return out;
  }
}

/** What an event says beyond its type, device and fence. */
function eventDetail(e) {
  if (e.type === 'dwell') return `dwell ${fmtDur(e.dwell_s)}`;
  if (e.type === 'exit') return `after ${fmtDur(e.duration_s)}`;
  return '';
}

/**
 * One event as a list row; device and fence are buttons calling `onSelect(kind, id)`.
 * `show` says which of device/fence to include (the details panel omits the one it is about).
 */
export function eventRow(e, onSelect, show = { device: true, fence: true }) {
  const detail = eventDetail(e);
  const what = el('span', { class: 'ev-what' });
  if (show.device) {
    what.append(el('button', { class: 'link', type: 'button', text: e.device, title: 'device',
      on: { click: () => onSelect('device', e.device) } }));
  }
  if (show.device && show.fence) what.append(' → ');
  if (show.fence) {
    what.append(el('button', { class: 'link', type: 'button', text: e.fence, title: 'fence',
      on: { click: () => onSelect('fence', e.fence) } }));
  }
  if (detail) what.append(el('span', { class: 'muted', text: ` · ${detail}` }));
  return el('li', { class: `ev ev-${e.type}`, data: { seq: e.seq, type: e.type }, title: `seq ${e.seq} · id ${e.id} · at ${e.at}` },
    el('span', { class: 'ev-time', text: fmtTime(e.at) }),
    el('span', { class: 'ev-type', text: e.type }),
    what);
}

/** The scrolling feed: newest on top, at most FEED_ROWS rows. */
export class Feed {
  constructor(list, emptyNote, countEl, onSelect) {
    this.list = list;
    this.emptyNote = emptyNote;
    this.countEl = countEl;
    this.onSelect = onSelect;
    this.total = 0;
  }

  add(e) {
    this.total += 1;
    const row = eventRow(e, this.onSelect);
    row.classList.add('fresh');
    this.prepend(row);
  }

  note(text) {
    this.prepend(el('li', { class: 'note' }, el('span', { class: 'ev-note', text })));
  }

  prepend(row) {
    this.list.prepend(row);
    while (this.list.childElementCount > FEED_ROWS) this.list.lastElementChild.remove();
    this.emptyNote.hidden = true;
    this.countEl.textContent = this.total > FEED_ROWS ? `(${this.total} seen, latest ${FEED_ROWS})` : `(${this.total})`;
  }
}
