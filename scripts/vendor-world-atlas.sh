#!/usr/bin/env bash
# Regenerates the live map's offline base layer, assets/ui/vendor/world-atlas/{land,borders}.json,
# from the npm package world-atlas (Natural Earth 1:50m, public domain data; the package is ISC).
# Run by hand when upgrading; the build and the tests never run it (the output is committed).
#
#   scripts/vendor-world-atlas.sh [VERSION]     (default 2.0.2)
#
# Works in a temporary directory: `npm pack world-atlas@VERSION` and `npm install
# topojson-client@3` there, never in the repository's node trees. Then, with topojson-client:
#   land    = feature(land-50m.json, objects.land)                     -> one MultiPolygon
#   borders = mesh(countries-50m.json, objects.countries, (a, b) => a !== b)
#                                              -> one MultiLineString (shared borders only;
#                                                 coastlines are the land polygons' outlines)
# coordinates rounded to 3 decimals (about 100 m, finer than the 1:50m data), consecutive
# duplicates dropped, rings shorter than 4 points and lines shorter than 2 dropped. Needs node >= 20.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-2.0.2}
SCALE=50m
DECIMALS=3
OUT=assets/ui/vendor/world-atlas
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

(cd "$TMP" && npm pack "world-atlas@$VERSION" --silent >/dev/null && tar xzf world-atlas-*.tgz \
  && npm install --silent --no-audit --no-fund --no-save topojson-client@3 >/dev/null)

cat >"$TMP/convert.mjs" <<'EOF'
import { readFileSync, writeFileSync } from 'node:fs';
import { feature, mesh } from 'topojson-client';

const [dir, scale, decimals, version, out] = process.argv.slice(2);
const k = 10 ** Number(decimals);
const r = (v) => Math.round(v * k) / k;
function line(coords, minLen) {
  const o = [];
  for (const [x, y] of coords) {
    const p = [r(x), r(y)];
    const l = o[o.length - 1];
    if (!l || l[0] !== p[0] || l[1] !== p[1]) o.push(p);
  }
  return o.length >= minLen ? o : null;
}
function polygons(g) {
  const list = g.type === 'Polygon' ? [g.coordinates] : g.type === 'MultiPolygon' ? g.coordinates : [];
  const res = [];
  for (const p of list) {
    const shell = line(p[0], 4);
    if (shell) res.push([shell, ...p.slice(1).map((h) => line(h, 4)).filter(Boolean)]);
  }
  return res;
}
const read = (name) => JSON.parse(readFileSync(`${dir}/${name}-${scale}.json`, 'utf8'));
const landTopo = read('land');
const land = feature(landTopo, landTopo.objects.land);
const geoms = land.type === 'FeatureCollection' ? land.features.map((f) => f.geometry) : [land.geometry];
const countries = read('countries');
const b = mesh(countries, countries.objects.countries, (x, y) => x !== y);
const lines = (b.type === 'MultiLineString' ? b.coordinates : [b.coordinates]).map((l) => line(l, 2)).filter(Boolean);
const source = `Natural Earth 1:${scale} (public domain) via world-atlas ${version}`;
const write = (name, props, geometry) =>
  writeFileSync(`${out}/${name}.json`, JSON.stringify({ type: 'Feature', properties: { ...props, source }, geometry }));
write('land', { name: 'land' }, { type: 'MultiPolygon', coordinates: geoms.flatMap(polygons) });
write('borders', { name: 'country borders' }, { type: 'MultiLineString', coordinates: lines });
EOF

mkdir -p "$OUT"
node "$TMP/convert.mjs" "$TMP/package" "$SCALE" "$DECIMALS" "$VERSION" "$PWD/$OUT"
cp "$TMP/package/LICENSE" "$OUT/LICENSE"
echo "world-atlas $VERSION ($SCALE, $DECIMALS decimals) -> $OUT:"
ls -l "$OUT"
