// The map: fences as vector shapes, devices as circle markers, the selected device's recent
// track, a coordinate grid, an offline base layer (Natural Earth 1:50m land and country borders,
// vendored under vendor/world-atlas/, so no tile server is needed), and an optional tile layer
// when the server config names one. Built on the vendored Leaflet (window.L).
//
// Panes, bottom to top: gdBase 150 (land, coastlines, borders; under the tile pane, 200, so tiles
// cover it where they load and it shows where they do not), gdGrid 250, fences (overlayPane 400),
// gdTrack 410, gdLabels 420, gdDevices 450. Only fences take the pointer.
//
// Rendering choices, for scale:
// - Devices are drawn on one canvas (thousands of markers redraw cheaply every second), at most
//   MAX_DRAWN_DEVICES of them: those in view, inside a fence first. Their pane ignores the
//   pointer, so it never hides the fences underneath; clicks and hovers find the nearest drawn
//   device by pixel distance instead (a linear scan of at most 5000 points per click).
// - Fences are SVG paths while there are at most SVG_FENCE_LIMIT of them (crisp outlines, DOM
//   nodes carrying data-fence), and canvas beyond that.

import { getAsset } from './api.js';

const L = window.L;

/** Most device markers drawn at once. */
export const MAX_DRAWN_DEVICES = 5000;
const SVG_FENCE_LIMIT = 1000;
/** Up to this many fences get a permanent label with their id and inside count. */
const LABEL_LIMIT = 40;
/** How close (pixels) a click must be to a device marker to select it. */
const HIT_PX = 9;

const COLOUR_INSIDE = '#e8590c';
const COLOUR_OUTSIDE = '#1c7ed6';
const COLOUR_TRACK = '#343a40';

/** The vendored base layer (assets/ui/vendor/world-atlas/README.md). */
const BASE_LAND = '/ui/vendor/world-atlas/land.json';
const BASE_BORDERS = '/ui/vendor/world-atlas/borders.json';

// Leaflet tooltips and attributions take HTML; everything put there from the API is escaped.
function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Leaflet latlngs from a GeoJSON fence geometry; null for shapes a fence cannot have. */
function fenceLatLngs(geometry) {
  if (!geometry) return null;
  if (geometry.type === 'Polygon') return L.GeoJSON.coordsToLatLngs(geometry.coordinates, 1);
  if (geometry.type === 'MultiPolygon') return L.GeoJSON.coordsToLatLngs(geometry.coordinates, 2);
  return null;
}

/** A GeoJSON Feature with a Multi* geometry as a FeatureCollection of its parts (`type`). */
function split(feature, type) {
  const g = feature.geometry || {};
  const parts = g.type === `Multi${type}` ? g.coordinates : g.type === type ? [g.coordinates] : [];
  return {
    type: 'FeatureCollection',
    features: parts.map((coordinates) => ({ type: 'Feature', properties: {}, geometry: { type, coordinates } })),
  };
}

export class MapView {
  /**
   * @param {HTMLElement} container
   * @param {{tile_url?: string|null, tile_attribution?: string|null}} config from /ui/config.json
   * @param {{onFence: (id: string) => void, onDevice: (id: string) => void}} handlers
   */
  constructor(container, config, handlers) {
    this.handlers = handlers;
    this.map = L.map(container, { minZoom: 1, maxZoom: 22, zoomSnap: 0.5, worldCopyJump: false });
    this.map.setView([30, 0], 2);
    this.map.attributionControl.setPrefix(
      '<a href="https://leafletjs.com" title="A JavaScript library for interactive maps">Leaflet</a>');
    if (config.tile_url) {
      L.tileLayer(config.tile_url, {
        maxZoom: 19,
        attribution: escapeHtml(config.tile_attribution || ''),
      }).addTo(this.map);
    }
    L.control.scale({ imperial: false }).addTo(this.map);
    this.addCoordsControl();

    // Panes (see the top of this file): base layer, grid, fences (overlayPane, 400), the selected
    // device's track, fence labels, devices (over fences and their labels, so a label never
    // hides a device). Only the fences take the pointer.
    this.map.createPane('gdBase').style.zIndex = 150;
    this.map.getPane('gdBase').style.pointerEvents = 'none';
    this.map.createPane('gdGrid').style.zIndex = 250;
    this.map.getPane('gdGrid').style.pointerEvents = 'none';
    this.map.createPane('gdTrack').style.zIndex = 410;
    this.map.getPane('gdTrack').style.pointerEvents = 'none';
    this.map.createPane('gdLabels').style.zIndex = 420;
    this.map.getPane('gdLabels').style.pointerEvents = 'none';
    this.map.createPane('gdDevices').style.zIndex = 450;
    this.map.getPane('gdDevices').style.pointerEvents = 'none';
    this.gridRenderer = L.canvas({ pane: 'gdGrid' });
    this.deviceRenderer = L.canvas({ pane: 'gdDevices', padding: 0.2 });
    // SVG for the base layer and the track: one path each, which the browser test can find.
    this.baseRenderer = L.svg({ pane: 'gdBase', padding: 0.3 });
    this.trackRenderer = L.svg({ pane: 'gdTrack' });
    /** The selected device's track polyline, when it has at least two positions. */
    this.track = null;
    this.grid = L.layerGroup().addTo(this.map);
    this.fenceGroup = L.featureGroup().addTo(this.map);
    this.deviceGroup = L.layerGroup().addTo(this.map);

    /** @type {Map<string, {layer: L.Path, label: boolean, count: number}>} */
    this.fences = new Map();
    /** @type {Map<string, L.CircleMarker>} */
    this.markers = new Map();
    this.devices = [];
    this.selected = { kind: null, id: null };
    this.fittedOnce = false;
    this.lastStats = { total: 0, located: 0, drawn: 0, capped: false };

    this.hoverTip = L.tooltip({ direction: 'top', offset: [0, -6], className: 'gd-device-tip' });
    this.map.on('moveend', () => {
      this.drawGrid();
      this.drawDevices();
    });
    this.map.on('click', (e) => this.click(e, null));
    // Hover hit-testing scans the drawn markers: at most once per animation frame.
    let pending = null;
    this.map.on('mousemove', (e) => {
      if (pending === null) {
        requestAnimationFrame(() => {
          const ev = pending;
          pending = null;
          if (ev) this.hover(ev);
        });
      }
      pending = e;
    });
    // Leaving the map ends the hover: no device tooltip or coordinates left behind.
    this.map.on('mouseout', () => {
      pending = null; // a hover still waiting for its frame must not bring the tooltip back
      if (this.map.hasLayer(this.hoverTip)) this.map.removeLayer(this.hoverTip);
      this.map.getContainer().style.cursor = '';
      if (this.coordsEl) this.coordsEl.textContent = '';
    });
    this.drawGrid();
  }

  /**
   * Loads and draws the offline base layer: land (filled, its outline the coastline) and country
   * borders, under everything, not interactive. With a tile layer it stays beneath the tiles.
   * Resolves once drawn; rejects (the map works on without it) when the files cannot be read.
   */
  async loadBase() {
    const [land, borders] = await Promise.all([getAsset(BASE_LAND), getAsset(BASE_BORDERS)]);
    // One path per polygon and per border line, not one for the whole MultiPolygon: Leaflet
    // skips the clipping and drawing of a path outside the view, so a zoomed-in map redraws only
    // the few shapes it shows. Styles as options, not `style`: Leaflet applies className only
    // when it creates the path.
    const common = { renderer: this.baseRenderer, interactive: false, smoothFactor: 1.5 };
    L.geoJSON(split(land, 'Polygon'), {
      ...common, className: 'gd-land', color: '#9fb1c2', weight: 0.8, fillColor: '#f7f5f0', fillOpacity: 1,
    }).addTo(this.map);
    L.geoJSON(split(borders, 'LineString'), {
      ...common, className: 'gd-borders', color: '#b4a59a', weight: 0.8, dashArray: '4 3', fill: false,
    }).addTo(this.map);
    this.map.attributionControl.addAttribution('Natural Earth (public domain)');
  }

  /**
   * Draws the selected device's recent track (oldest first), or removes it (null, or fewer than
   * two positions). The path carries data-device and data-points for the browser test.
   * @param {string|null} id
   * @param {Array<[number, number]>|null} points
   */
  setTrack(id, points) {
    if (!id || !points || points.length < 2) {
      if (this.track) {
        this.map.removeLayer(this.track);
        this.track = null;
      }
      return;
    }
    if (!this.track) {
      this.track = L.polyline(points, {
        renderer: this.trackRenderer, interactive: false, className: 'gd-track',
        color: COLOUR_TRACK, weight: 3, opacity: 0.7, lineJoin: 'round', lineCap: 'round',
      }).addTo(this.map);
    } else {
      this.track.setLatLngs(points);
    }
    const path = this.track.getElement();
    if (path) {
      path.setAttribute('data-device', id);
      path.setAttribute('data-points', String(points.length));
    }
  }

  addCoordsControl() {
    const Coords = L.Control.extend({
      onAdd: () => {
        this.coordsEl = L.DomUtil.create('div', 'gd-coords');
        this.coordsEl.textContent = '';
        return this.coordsEl;
      },
    });
    new Coords({ position: 'bottomleft' }).addTo(this.map);
  }

  /** A light lat/lon grid with about 3-10 lines per axis, so a map without tiles has a scale. */
  drawGrid() {
    this.grid.clearLayers();
    const b = this.map.getBounds();
    const s = Math.max(-85, b.getSouth());
    const n = Math.min(85, b.getNorth());
    const w = Math.max(-180, b.getWest());
    const e = Math.min(180, b.getEast());
    if (!(n > s && e > w)) return;
    const span = Math.max(n - s, e - w);
    const steps = [30, 10, 5, 2, 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002, 0.0001];
    const step = steps.find((x) => span / x >= 3) ?? steps[steps.length - 1];
    const style = { renderer: this.gridRenderer, color: '#c3cad2', weight: 1, interactive: false };
    for (let i = Math.ceil(s / step); i * step <= n; i++) {
      this.grid.addLayer(L.polyline([[i * step, w], [i * step, e]], style));
    }
    for (let i = Math.ceil(w / step); i * step <= e; i++) {
      this.grid.addLayer(L.polyline([[s, i * step], [n, i * step]], style));
    }
  }

  /**
   * Replaces the fences drawn.
   * @param {Array<{id: string, feature: object, colour: string}>} fences sorted by id
   */
  setFences(fences) {
    this.fenceGroup.clearLayers();
    this.fences.clear();
    const renderer = fences.length <= SVG_FENCE_LIMIT ? L.svg() : L.canvas({ padding: 0.2 });
    const labels = fences.length <= LABEL_LIMIT;
    for (const f of fences) {
      const style = {
        renderer,
        color: f.colour,
        weight: 2,
        fillColor: f.colour,
        fillOpacity: 0.12,
        className: 'gd-fence',
      };
      const g = f.feature.geometry;
      const props = f.feature.properties || {};
      let layer = null;
      if (g && g.type === 'Point' && Number(props.radius_m) > 0) {
        const [lon, lat] = g.coordinates;
        layer = L.circle([lat, lon], { ...style, radius: Number(props.radius_m) });
      } else {
        const latlngs = fenceLatLngs(g);
        if (latlngs) layer = L.polygon(latlngs, style);
      }
      if (!layer) continue;
      layer.on('click', (e) => {
        L.DomEvent.stopPropagation(e);
        this.click(e, f.id);
      });
      if (labels) {
        layer.bindTooltip(escapeHtml(f.id), {
          permanent: true, direction: 'top', offset: [0, -6], className: 'gd-fence-label', pane: 'gdLabels',
        });
      } else {
        layer.bindTooltip(escapeHtml(props.name ? `${f.id} · ${props.name}` : f.id), { sticky: true });
      }
      this.fenceGroup.addLayer(layer);
      const path = layer.getElement && layer.getElement();
      if (path) path.setAttribute('data-fence', f.id);
      this.fences.set(f.id, { layer, label: labels, count: 0, colour: f.colour });
    }
    this.styleSelection();
    if (!this.fittedOnce && fences.length > 0) {
      this.fittedOnce = true;
      this.map.fitBounds(this.fenceGroup.getBounds(), { padding: [30, 30], maxZoom: 17 });
    }
  }

  /** Updates the inside counts shown on the fence labels. */
  setCounts(counts) {
    for (const [id, f] of this.fences) {
      const n = counts.get(id) || 0;
      if (f.label && n !== f.count) f.layer.setTooltipContent(escapeHtml(n > 0 ? `${id} · ${n} inside` : id));
      f.count = n;
    }
  }

  /**
   * Replaces the device list; draws at most MAX_DRAWN_DEVICES, those in view first
   * (inside a fence before outside).
   * @param {Array<{device: string, lat: number|null, lon: number|null, inside: string[]}>} devices
   */
  setDevices(devices) {
    this.devices = devices;
    if (!this.fittedOnce && this.fences.size === 0) {
      const pts = devices.filter((d) => d.lat !== null && d.lon !== null).map((d) => [d.lat, d.lon]);
      if (pts.length > 0) {
        this.fittedOnce = true;
        this.map.fitBounds(L.latLngBounds(pts), { padding: [30, 30], maxZoom: 15 });
      }
    }
    return this.drawDevices();
  }

  drawDevices() {
    const located = this.devices.filter((d) => Number.isFinite(d.lat) && Number.isFinite(d.lon));
    const view = this.map.getBounds().pad(0.1);
    let chosen = located;
    let capped = false;
    if (located.length > MAX_DRAWN_DEVICES) {
      capped = true;
      // Devices inside a fence matter most, then the rest; each group in list order, which is
      // stable from one poll to the next, so the drawn set does not flicker.
      const inView = located.filter((d) => view.contains([d.lat, d.lon]));
      const inside = inView.filter((d) => d.inside && d.inside.length > 0);
      const outside = inView.filter((d) => !(d.inside && d.inside.length > 0));
      chosen = inside.concat(outside).slice(0, MAX_DRAWN_DEVICES);
      const sel = this.selected.kind === 'device' ? located.find((d) => d.device === this.selected.id) : null;
      if (sel && !chosen.includes(sel)) chosen.push(sel);
    }
    const keep = new Set();
    for (const d of chosen) {
      keep.add(d.device);
      const inside = d.inside && d.inside.length > 0;
      const selected = this.selected.kind === 'device' && this.selected.id === d.device;
      const style = {
        radius: selected ? 8 : 5,
        color: selected ? '#000' : '#fff',
        weight: selected ? 2.5 : 1.5,
        fillColor: inside ? COLOUR_INSIDE : COLOUR_OUTSIDE,
        fillOpacity: 0.95,
      };
      let m = this.markers.get(d.device);
      if (!m) {
        m = L.circleMarker([d.lat, d.lon], { ...style, renderer: this.deviceRenderer, interactive: false });
        m.deviceId = d.device;
        this.deviceGroup.addLayer(m);
        this.markers.set(d.device, m);
      } else {
        const ll = m.getLatLng();
        if (ll.lat !== d.lat || ll.lng !== d.lon) m.setLatLng([d.lat, d.lon]);
        const o = m.options;
        if (o.radius !== style.radius || o.color !== style.color || o.fillColor !== style.fillColor) {
          m.setStyle(style);
          m.setRadius(style.radius);
        }
      }
      if (selected) m.bringToFront();
    }
    for (const [id, m] of this.markers) {
      if (!keep.has(id)) {
        this.deviceGroup.removeLayer(m);
        this.markers.delete(id);
      }
    }
    this.lastStats = { total: this.devices.length, located: located.length, drawn: keep.size, capped };
    return this.lastStats;
  }

  /** The drawn device nearest to a container point, within HIT_PX. */
  nearestDevice(point) {
    let best = null;
    let bestD = HIT_PX * HIT_PX;
    for (const [id, m] of this.markers) {
      const p = this.map.latLngToContainerPoint(m.getLatLng());
      const dx = p.x - point.x;
      const dy = p.y - point.y;
      const d = dx * dx + dy * dy;
      if (d <= bestD) {
        bestD = d;
        best = id;
      }
    }
    return best;
  }

  click(e, fenceId) {
    const device = this.nearestDevice(e.containerPoint);
    if (device) this.handlers.onDevice(device);
    else if (fenceId) this.handlers.onFence(fenceId);
  }

  hover(e) {
    const ll = e.latlng;
    if (this.coordsEl) this.coordsEl.textContent = `${ll.lat.toFixed(5)}, ${ll.lng.toFixed(5)}`;
    const id = this.nearestDevice(e.containerPoint);
    this.map.getContainer().style.cursor = id ? 'pointer' : '';
    if (id) {
      this.hoverTip.setLatLng(this.markers.get(id).getLatLng()).setContent(escapeHtml(id));
      if (!this.map.hasLayer(this.hoverTip)) this.hoverTip.addTo(this.map);
    } else if (this.map.hasLayer(this.hoverTip)) {
      this.map.removeLayer(this.hoverTip);
    }
  }

  /** Highlights the selected fence or device. */
  select(kind, id) {
    this.selected = { kind, id };
    this.styleSelection();
    this.drawDevices();
  }

  styleSelection() {
    for (const [id, f] of this.fences) {
      const on = this.selected.kind === 'fence' && this.selected.id === id;
      f.layer.setStyle({ weight: on ? 4 : 2, fillOpacity: on ? 0.25 : 0.12 });
    }
  }

  /** Pans and zooms to a fence. */
  showFence(id) {
    const f = this.fences.get(id);
    if (f) this.map.fitBounds(f.layer.getBounds(), { padding: [40, 40], maxZoom: 17 });
  }

  /** Pans to a device if it has a position. */
  showDevice(id) {
    const d = this.devices.find((x) => x.device === id);
    if (d && Number.isFinite(d.lat) && Number.isFinite(d.lon)) {
      this.map.panTo([d.lat, d.lon]);
    }
  }

  /** Page coordinates of a drawn device marker (used by the browser test), or null. */
  devicePagePoint(id) {
    const m = this.markers.get(id);
    if (!m) return null;
    const p = this.map.latLngToContainerPoint(m.getLatLng());
    const r = this.map.getContainer().getBoundingClientRect();
    return { x: r.left + p.x, y: r.top + p.y };
  }
}
