// Small DOM and formatting helpers shared by the page's modules.
//
// Every string that came from the API (device ids, fence names, tags) reaches the DOM through
// `el()` / textContent, never innerHTML: ids are client-chosen and must not be able to inject
// markup into an operator's browser.

/**
 * Creates an element. `attrs` keys: `class`, `text`, `title`, `data` (object -> data-*),
 * `on` (object of event listeners), anything else becomes an attribute.
 * Children may be nodes, strings (as text) or null (skipped).
 */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = String(v);
    else if (k === 'data') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = String(dv);
    else if (k === 'on') for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** A stable colour for a fence id, so a fence keeps its colour across reloads. */
export function fenceColour(id) {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) {
    h ^= id.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  // Hues that stay readable on the light background; skip the device colours' neighbourhood.
  const hue = ((h >>> 0) % 300 + 230) % 360;
  return `hsl(${hue}, 60%, 42%)`;
}

const pad = (n) => String(n).padStart(2, '0');

/** RFC 3339 -> "HH:MM:SS" local time, with the date when it is not today. */
export function fmtTime(rfc3339) {
  if (!rfc3339) return '–';
  const d = new Date(rfc3339);
  if (Number.isNaN(d.getTime())) return String(rfc3339);
  const hms = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const now = new Date();
  if (d.toDateString() === now.toDateString()) return hms;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hms}`;
}

/** Seconds -> "1h 5m", "42s", "1.5s". */
export function fmtDur(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(Number(seconds))) return '–';
  let s = Number(seconds);
  if (s < 60) return `${Math.round(s * 10) / 10}s`;
  const parts = [];
  for (const [unit, n] of [['d', 86400], ['h', 3600], ['m', 60], ['s', 1]]) {
    const q = Math.floor(s / n);
    if (q > 0) { parts.push(`${q}${unit}`); s -= q * n; }
    if (parts.length === 2) break;
  }
  return parts.join(' ');
}

const DUR_UNITS = { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 };

/**
 * A duration as the API writes it ("90s", "1m", "1h", "1500ms"; also "1h30m") -> milliseconds;
 * null when it is not one.
 */
export function parseDur(text) {
  const s = String(text ?? '').trim();
  if (!/^(\d+(\.\d+)?(ms|s|m|h|d))+$/.test(s)) return null;
  let ms = 0;
  for (const [, n, , unit] of s.matchAll(/(\d+(\.\d+)?)(ms|s|m|h|d)/g)) ms += Number(n) * DUR_UNITS[unit];
  return ms;
}

/** A short one-line rendering of a JSON value (tags, settings). */
export function fmtValue(v) {
  if (v === null || v === undefined) return '–';
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) return v.length ? v.map(fmtValue).join(', ') : '–';
  return JSON.stringify(v);
}

/** Calls `fn` at most once per `ms`, trailing call included. */
export function throttle(fn, ms) {
  let timer = null;
  let last = 0;
  return (...args) => {
    const wait = last + ms - Date.now();
    if (wait <= 0) {
      last = Date.now();
      fn(...args);
    } else if (!timer) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn(...args);
      }, wait);
    }
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
