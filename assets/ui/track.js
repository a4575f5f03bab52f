// Devices' recent tracks: the positions the page saw, kept in small per-device rings so the
// selected device's track can be drawn at once, with some history, when it is selected.
//
// Bounded: at most MAX_TRACKED devices have a ring (the first seen, in list order, plus the
// selected device always); a ring holds the last TRACK_POINTS positions, or TRACK_POINTS_SELECTED
// for the selected device (it grows on selection and shrinks back, keeping the newest, after).
// A ring is one Float64Array (16 bytes a position), so 20,000 devices of 20 points cost about
// 10 MB with the objects around them. Devices that leave the device list (deleted) lose their ring
// at the next scan.
//
// A position is recorded when it differs from the device's previous one and its fix is not older
// than the newest recorded (two sources may answer out of order). The sources are the
// device poll (about one position a second per device) and the selected device's details
// (GET /v1/devices/{id}, every 2 s): fixes that arrive between two polls are not seen, so a
// track is what the page saw since it opened, not every fix.

/** Positions kept per device. */
export const TRACK_POINTS = 20;
/** Positions kept for the selected device. */
export const TRACK_POINTS_SELECTED = 200;
/** Devices with a ring, at most (the selected device always gets one). */
export const MAX_TRACKED = 20000;

class Ring {
  constructor(cap) {
    /** lat, lon, lat, lon, … */
    this.xy = new Float64Array(2 * cap);
    this.start = 0;
    this.len = 0;
    /** Fix time (ms) of the newest position, so an older answer never extends the track. */
    this.lastT = -Infinity;
  }

  get cap() {
    return this.xy.length / 2;
  }

  push(lat, lon, t) {
    if (Number.isFinite(t)) {
      if (t < this.lastT) return false;
      this.lastT = t;
    }
    if (this.len > 0) {
      const last = (this.start + this.len - 1) % this.cap;
      if (this.xy[2 * last] === lat && this.xy[2 * last + 1] === lon) return false;
    }
    const i = (this.start + this.len) % this.cap;
    this.xy[2 * i] = lat;
    this.xy[2 * i + 1] = lon;
    if (this.len < this.cap) this.len++;
    else this.start = (this.start + 1) % this.cap;
    return true;
  }

  /** Oldest first, as [lat, lon] pairs. */
  points() {
    const out = new Array(this.len);
    for (let k = 0; k < this.len; k++) {
      const i = (this.start + k) % this.cap;
      out[k] = [this.xy[2 * i], this.xy[2 * i + 1]];
    }
    return out;
  }

  /** A copy holding the newest `cap` points. */
  resized(cap) {
    const r = new Ring(cap);
    const pts = this.points();
    for (const [lat, lon] of pts.slice(Math.max(0, pts.length - cap))) r.push(lat, lon);
    r.lastT = this.lastT;
    return r;
  }
}

export class Tracks {
  constructor() {
    /** @type {Map<string, Ring>} */
    this.rings = new Map();
    this.selected = null;
  }

  /**
   * Records one scan of GET /v1/devices (every device read, in list order) and forgets the
   * devices it no longer lists.
   * @param {Array<{device: string, lat: number|null, lon: number|null, last_fix_at: string|null}>} devices
   */
  record(devices) {
    const seen = new Set();
    for (const d of devices) {
      seen.add(d.device);
      if (Number.isFinite(d.lat) && Number.isFinite(d.lon)) this.add(d.device, d.lat, d.lon, d.last_fix_at);
    }
    for (const id of this.rings.keys()) {
      if (!seen.has(id) && id !== this.selected) this.rings.delete(id);
    }
  }

  /**
   * Adds one position of a device, with its fix time (RFC 3339) when known; false when it was
   * not recorded (same place, older than the newest recorded, or no room for another device).
   */
  add(id, lat, lon, fixAt = null) {
    let r = this.rings.get(id);
    if (!r) {
      if (this.rings.size >= MAX_TRACKED && id !== this.selected) return false;
      r = new Ring(id === this.selected ? TRACK_POINTS_SELECTED : TRACK_POINTS);
      this.rings.set(id, r);
    }
    return r.push(lat, lon, fixAt ? Date.parse(fixAt) : NaN);
  }

  /** The selected device keeps the longer ring; the previous one shrinks back. */
  select(id) {
    if (id === this.selected) return;
    const prev = this.selected;
    this.selected = id;
    if (prev !== null && this.rings.has(prev)) this.rings.set(prev, this.rings.get(prev).resized(TRACK_POINTS));
    if (id !== null && this.rings.has(id)) this.rings.set(id, this.rings.get(id).resized(TRACK_POINTS_SELECTED));
  }

  /** A device's recent positions, oldest first ([] when none). */
  points(id) {
    const r = this.rings.get(id);
    return r ? r.points() : [];
  }
}
