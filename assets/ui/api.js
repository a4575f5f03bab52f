// The page's only way to talk to the server: every fetch and WebSocket goes through here, so an
// API key (when the server requires one) is attached in one place.
//
// Key sources, in order: `?key=...` in the page URL (then remembered in localStorage and removed
// from the address bar, so it does not linger in history or screenshots; `?key=` with an empty
// value forgets it), or the key remembered earlier. Fetches send it as `Authorization: Bearer`;
// WebSockets cannot set headers from a browser, so they send it as `?access_token=`.

const KEY_STORE = 'geodwell.apiKey';
let memoryKey = null; // used when localStorage is unavailable

/** Takes `?key=` out of the page URL into storage. Call once at start. */
export function initAuth() {
  const url = new URL(window.location.href);
  if (!url.searchParams.has('key')) return;
  const key = url.searchParams.get('key');
  try {
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch {
    memoryKey = key || null; // storage disabled: keep it for this page only
  }
  url.searchParams.delete('key');
  window.history.replaceState(null, '', url);
}

function apiKey() {
  try {
    return localStorage.getItem(KEY_STORE) || memoryKey;
  } catch {
    return memoryKey;
  }
}

/** Whether a key is set (the page says so when the server refuses it). */
export const hasKey = () => Boolean(apiKey());

/** An error answer: `status` and the server's `{"error":{"code","message"}}`. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** GET `path` (with query `params`) as JSON; throws ApiError on a non-2xx answer. */
export async function getJson(path, params = {}, { signal } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
  }
  const headers = { Accept: 'application/json' };
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  let res;
  try {
    res = await fetch(url, { headers, signal, cache: 'no-store' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', `cannot reach the server: ${e.message}`);
  }
  if (!res.ok) {
    let code = `http_${res.status}`;
    let message = res.statusText || `HTTP ${res.status}`;
    try {
      const body = await res.json();
      if (body && body.error) ({ code, message } = body.error);
    } catch {
      // not JSON: keep the status text
    }
    throw new ApiError(res.status, code, message);
  }
  return res.json();
}

/**
 * GET one of the page's own static JSON files under /ui/ (the vendored base layer). No key (the
 * assets are served without one) and the browser's normal cache: the server's ETag turns a
 * reload into a 304, where getJson's `no-store` would download it again.
 */
export async function getAsset(path) {
  let res;
  try {
    res = await fetch(new URL(path, window.location.origin), { headers: { Accept: 'application/json' } });
  } catch (e) {
    throw new ApiError(0, 'network', `cannot reach the server: ${e.message}`);
  }
  if (!res.ok) throw new ApiError(res.status, `http_${res.status}`, `${path}: HTTP ${res.status}`);
  return res.json();
}

/** Opens a WebSocket to `path` on this server with query `params` (null values skipped). */
export function openSocket(path, params = {}) {
  const url = new URL(path, window.location.origin);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
  }
  const key = apiKey();
  if (key) url.searchParams.set('access_token', key);
  return new WebSocket(url);
}
