#!/usr/bin/env bash
# PostGIS side by side (issue 5): which fences cover each fix, geodwell's FenceIndex::containing
# against PostGIS's ST_Covers on the same data, in one run. See docs/bench-postgis.md.
#
#   flock /tmp/bench.lock benches/postgis.sh                  # full run: 1,000,000 fixes per mix
#   benches/postgis.sh --points 20000                         # smoke run
#
# Steps: installs PostGIS from the distribution's packages if the server lacks it; generates the
# data of benches/fences.rs and times geodwell on it (cargo bench --bench postgis); loads fences
# and points into the database (GiST index; a tuned copy with ST_Subdivide'd fences); times
# ST_Covers containment of every fix (single backend, no parallel workers; also a parallel run
# and a query per fix through pgbench); exports PostGIS's (fix, fence) pairs and checks that they
# equal geodwell's; prints a markdown table and writes target/bench/postgis.json.
# Exit status: 0 when every compared pair set is identical, 1 when some differ (details printed
# and in the compare_*.json files), 2 on usage errors, other non-zero on failures.
set -Eeuo pipefail

usage() {
	cat <<'EOF'
usage: benches/postgis.sh [options]
  --points N      fixes per mix (default 1000000; e.g. 20000 for a smoke run)
  --db NAME       database to create/use (default geodwell_bench; dropped tables are its own)
  --max-secs S    a PostGIS variant whose full run would take longer than S seconds (estimated
                  from its warm-up over a tenth of the fixes) is timed on the first fixes only,
                  as many as fit in S seconds, and its rate extrapolated (default 900)
  --runs R        timed runs per variant, median reported (default 3; 1 for runs over 60 s)
  --per-fix N     fixes for the query-per-fix rows via pgbench (default 10000; 0 skips them)
  --subdivide V   ST_Subdivide max_vertices of the tuned variant (default 256)
  --no-parallel   skip the parallel-query rows
  --reload        reload the database even if it already holds this exact data
Connection: the usual libpq variables (PGHOST, PGPORT, PGUSER; PGUSER defaults to postgres).
EOF
}

POINTS=1000000
DB=geodwell_bench
MAX_SECS=900
RUNS=3
PER_FIX=10000
SUBDIVIDE=256
PARALLEL=1
RELOAD=0
while [ $# -gt 0 ]; do
	case "$1" in
	--points) POINTS=${2:?--points needs a value}; shift 2 ;;
	--db) DB=${2:?--db needs a value}; shift 2 ;;
	--max-secs) MAX_SECS=${2:?--max-secs needs a value}; shift 2 ;;
	--runs) RUNS=${2:?--runs needs a value}; shift 2 ;;
	--per-fix) PER_FIX=${2:?--per-fix needs a value}; shift 2 ;;
	--subdivide) SUBDIVIDE=${2:?--subdivide needs a value}; shift 2 ;;
	--no-parallel) PARALLEL=0; shift ;;
	--reload) RELOAD=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "postgis.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
	esac
done
for v in POINTS MAX_SECS RUNS PER_FIX SUBDIVIDE; do
	[[ ${!v} =~ ^[0-9]+$ ]] || { echo "postgis.sh: $v must be a non-negative integer, got '${!v}'" >&2; exit 2; }
done
[[ $DB =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "postgis.sh: --db must be a plain lower-case identifier" >&2; exit 2; }
[ "$POINTS" -ge 100 ] || { echo "postgis.sh: --points must be at least 100" >&2; exit 2; }
[ "$RUNS" -ge 1 ] || { echo "postgis.sh: --runs must be at least 1" >&2; exit 2; }
[ "$SUBDIVIDE" -ge 8 ] || { echo "postgis.sh: --subdivide must be at least 8 (ST_Subdivide's minimum)" >&2; exit 2; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
DATA=$TARGET/bench/postgis-data
export PGUSER=${PGUSER:-postgres}
LONG_RUN=${POSTGIS_LONG_RUN:-60} # seconds: a variant whose run is longer gets only one (env override for tests)

die() {
	echo "postgis.sh: error: $*" >&2
	exit 3
}
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
# Any unexpected failure ends the run with status 3 (1 is reserved for "pair sets differ").
trap 'echo "postgis.sh: failed at line $LINENO (exit $?): $BASH_COMMAND" >&2; exit 3' ERR

pg() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
pg_admin() { psql -X -q -v ON_ERROR_STOP=1 -d "${PGADMINDB:-postgres}" "$@"; }

# Session settings of every single-core timing: no parallel workers (one core), no JIT (on a
# 20,000-fix join it added ~25 ms and gained nothing on these function-call-bound plans), enough
# work_mem for the DISTINCT of the subdivided variant to stay in memory.
SERIAL="SET max_parallel_workers_per_gather = 0; SET jit = off; SET work_mem = '256MB';"
NPROC=$(nproc 2>/dev/null || echo 2)
WORKERS=$((NPROC > 1 ? NPROC : 2))
PAR_CORES=$((WORKERS + 1 < NPROC ? WORKERS + 1 : NPROC))
PARALLEL_SET="SET max_parallel_workers_per_gather = $WORKERS; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0; SET jit = off; SET work_mem = '256MB';"

# ---------------------------------------------------------------------------------------------
log "checking tools and the server"
command -v psql >/dev/null || die "psql not found (apt-get install postgresql-client)"
command -v cargo >/dev/null || die "cargo not found"
psql -X -d "${PGADMINDB:-postgres}" -Atc 'SELECT 1' >/dev/null 2>&1 ||
	die "cannot connect to PostgreSQL as $PGUSER (database ${PGADMINDB:-postgres}); set PGHOST/PGPORT/PGUSER"
# shellcheck source=benches/common/postgis.sh
source "$ROOT/benches/common/postgis.sh"
ensure_postgis
# PostGIS 3.3.2 on PostgreSQL 15 crashed the backend (signal 11, the server then restarts every
# session) on "SELECT count(*)" over a table with an SP-GiST geometry index, planned as an
# index-only scan. None of the benchmark's queries can use one (they read the geometry), so
# turning them off for this database changes no timed plan and keeps stray queries safe.
pg -c "ALTER DATABASE $DB SET enable_indexonlyscan = off"
POSTGIS_VERSION=$(pg -Atc 'SELECT postgis_full_version()')
log "$POSTGIS_VERSION"
if command -v pgbench >/dev/null; then HAVE_PGBENCH=1; else HAVE_PGBENCH=0; fi
if [ "$PER_FIX" -gt 0 ] && [ $HAVE_PGBENCH = 0 ]; then
	log "pgbench not found: skipping the query-per-fix rows"
	PER_FIX=0
fi

# ---------------------------------------------------------------------------------------------
log "geodwell: generating $POINTS fixes per mix and timing FenceIndex::containing"
cd "$ROOT"
# Build once and run the binary directly: later steps must not rebuild a tree that is being edited.
BUILD_LOG=$(mktemp)
if ! cargo bench --bench postgis --no-run --message-format=json >"$BUILD_LOG" 2>"$BUILD_LOG.err"; then
	cat "$BUILD_LOG.err" >&2
	die "cargo bench --bench postgis --no-run failed"
fi
BENCH_BIN=$(grep -o '"executable":"[^"]*postgis[^"]*"' "$BUILD_LOG" | tail -1 | cut -d'"' -f4)
rm -f "$BUILD_LOG" "$BUILD_LOG.err"
[ -n "$BENCH_BIN" ] && [ -x "$BENCH_BIN" ] || die "could not find the built postgis bench binary"
bench() { "$BENCH_BIN" "$@"; }
mkdir -p "$DATA"
rm -f "$DATA"/postgis_*.pairs "$DATA"/compare_*.json "$DATA"/postgis_runs.tsv "$DATA"/postgis_meta.tsv "$DATA"/plans.txt
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')
bench --out "$DATA" --points "$POINTS"
for m in small large; do
	for f in "fences_$m.tsv" "points_$m.tsv" "geodwell_$m.pairs"; do
		[ -s "$DATA/$f" ] || [ "$f" = "geodwell_$m.pairs" ] || die "the Rust step did not write $DATA/$f"
	done
done

# ---------------------------------------------------------------------------------------------
DATA_SUM=$(cd "$DATA" && cat fences_small.tsv points_small.tsv fences_large.tsv points_large.tsv | md5sum | cut -d' ' -f1)
LOADED_SUM=$(pg -Atc "SELECT value FROM bench_meta WHERE key = 'data'" 2>/dev/null || true)
LOADED_SUB=$(pg -Atc "SELECT value FROM bench_meta WHERE key = 'subdivide'" 2>/dev/null || true)
meta() { pg -c "INSERT INTO bench_meta VALUES ('$1', '$2') ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"; }
meta_get() { pg -Atc "SELECT value FROM bench_meta WHERE key = '$1'"; }

# Single-core timing of "SELECT count(*) FROM (query)": prints "seconds count".
timed_count() {
	local settings=$1 q=$2 out ms n
	out=$(pg -At <<SQL
$settings
\\timing on
SELECT count(*) FROM ($q) q;
SQL
	)
	n=$(grep -E '^[0-9]+$' <<<"$out" | tail -1)
	ms=$(awk '/^Time:/ {v = $2} END {print v}' <<<"$out")
	[ -n "$n" ] && [ -n "$ms" ] || die "could not time query: $q; psql said: $out"
	awk -v ms="$ms" -v n="$n" 'BEGIN {printf "%.6f %d\n", ms / 1000, n}'
}

# Index for the tuned table: the faster of GiST (buffered build) and SP-GiST on a pilot.
choose_index() {
	local m=$1 pilot best="" best_s="" kind s1 s2 s
	pilot=$((POINTS < 20000 ? POINTS : 20000))
	for kind in gist spgist; do
		pg -c "DROP INDEX IF EXISTS fences_${m}_tuned_geom" >/dev/null
		if [ $kind = gist ]; then
			pg -c "CREATE INDEX fences_${m}_tuned_geom ON fences_${m}_tuned USING gist (geom) WITH (buffering = on)"
		else
			pg -c "CREATE INDEX fences_${m}_tuned_geom ON fences_${m}_tuned USING spgist (geom)"
		fi
		pg -c "ANALYZE fences_${m}_tuned"
		s1=$(timed_count "$SERIAL" "$(tuned_query "$m" "$pilot")")
		s2=$(timed_count "$SERIAL" "$(tuned_query "$m" "$pilot")")
		s1=${s1%% *}
		s2=${s2%% *}
		s=$(awk -v a="$s1" -v b="$s2" 'BEGIN {print (a < b ? a : b)}')
		log "  $m tuned pilot ($pilot fixes): $kind ${s} s"
		if [ -z "$best" ] || awk -v a="$s" -v b="$best_s" 'BEGIN {exit !(a < b)}'; then
			best=$kind
			best_s=$s
		fi
	done
	if [ "$best" = gist ]; then
		pg -c "DROP INDEX fences_${m}_tuned_geom" -c "CREATE INDEX fences_${m}_tuned_geom ON fences_${m}_tuned USING gist (geom) WITH (buffering = on)" -c "ANALYZE fences_${m}_tuned"
	fi
	meta "tuned_index_$m" "$best"
}

# The containment queries: MIX LIMIT [POINTS_TABLE]. The tuned one removes the duplicates that
# pieces of one fence give, when ST_Subdivide split any fence (not for the small mix).
plain_query() { echo "SELECT p.id AS point, f.id AS fence FROM ${3:-points_$1} p JOIN fences_$1 f ON ST_Covers(f.geom, p.geom) WHERE p.id < $2"; }
tuned_query() {
	local distinct=DISTINCT
	[ "$(meta_get "tuned_split_$1")" = 1 ] || distinct=
	echo "SELECT $distinct p.id AS point, f.id AS fence FROM ${3:-points_$1} p JOIN fences_$1_tuned f ON ST_Covers(f.geom, p.geom) WHERE p.id < $2"
}

if [ $RELOAD = 0 ] && [ "$LOADED_SUM" = "$DATA_SUM" ] && [ "$LOADED_SUB" = "$SUBDIVIDE" ]; then
	log "database $DB already holds this data (md5 $DATA_SUM, ST_Subdivide $SUBDIVIDE): not reloading (--reload forces it)"
else
	pg -c 'DROP TABLE IF EXISTS bench_meta' -c 'CREATE TABLE bench_meta (key text PRIMARY KEY, value text NOT NULL)'
	for m in small large; do
		log "loading the $m mix into $DB"
		t0=$(date +%s.%N)
		pg <<SQL
DROP TABLE IF EXISTS fences_$m, fences_${m}_tuned, points_$m, points_${m}_raw CASCADE;
CREATE TABLE fences_$m (id int PRIMARY KEY, name text NOT NULL, nvertices int NOT NULL,
                        geom geometry(Polygon, 4326) NOT NULL);
\\copy fences_$m FROM '$DATA/fences_$m.tsv'
CREATE INDEX fences_${m}_geom ON fences_$m USING gist (geom);
CREATE UNLOGGED TABLE points_${m}_raw (id int NOT NULL, lon float8 NOT NULL, lat float8 NOT NULL);
\\copy points_${m}_raw FROM '$DATA/points_$m.tsv'
CREATE TABLE points_$m AS
  SELECT id, ST_SetSRID(ST_MakePoint(lon, lat), 4326)::geometry(Point, 4326) AS geom
  FROM points_${m}_raw ORDER BY id;
ALTER TABLE points_$m ADD PRIMARY KEY (id);
DROP TABLE points_${m}_raw;
VACUUM ANALYZE fences_$m;
VACUUM ANALYZE points_$m;
SQL
		t1=$(date +%s.%N)
		log "  tuned copy: ST_Subdivide(geom, $SUBDIVIDE), pieces stored in-line (slow for the large fences: minutes)"
		pg <<SQL
CREATE TABLE fences_${m}_tuned (id int NOT NULL, geom geometry(Geometry, 4326) NOT NULL);
ALTER TABLE fences_${m}_tuned ALTER COLUMN geom SET STORAGE MAIN;
ALTER TABLE fences_${m}_tuned SET (toast_tuple_target = 8160);
INSERT INTO fences_${m}_tuned SELECT id, ST_Subdivide(geom, $SUBDIVIDE) FROM fences_$m;
VACUUM ANALYZE fences_${m}_tuned;
SQL
		t2=$(date +%s.%N)
		meta "load_s_$m" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')"
		meta "subdivide_s_$m" "$(awk -v a="$t1" -v b="$t2" 'BEGIN {printf "%.1f", b - a}')"
		meta "invalid_fences_$m" "$(pg -Atc "SELECT count(*) FILTER (WHERE NOT ST_IsValid(geom)) FROM fences_$m")"
		meta "vertices_$m" "$(pg -Atc "SELECT sum(ST_NPoints(geom)) FROM fences_$m")"
		meta "tuned_pieces_$m" "$(pg -Atc "SELECT count(*) FROM fences_${m}_tuned")"
		meta "tuned_max_vertices_$m" "$(pg -Atc "SELECT max(ST_NPoints(geom)) FROM fences_${m}_tuned")"
		meta "toast_bytes_$m" "$(pg -Atc "SELECT pg_total_relation_size('fences_$m') - pg_relation_size('fences_$m')")"
		choose_index "$m"
	done
	meta subdivide "$SUBDIVIDE"
	meta data "$DATA_SUM"
fi

# Whether ST_Subdivide split any fence of the mix (then the tuned query needs DISTINCT), and the
# boundary probes (untimed; small, so loaded on every run).
for m in small large; do
	meta "tuned_split_$m" "$(pg -Atc "SELECT CASE WHEN (SELECT count(*) FROM fences_${m}_tuned) > (SELECT count(*) FROM fences_$m) THEN 1 ELSE 0 END")"
	pg <<SQL
DROP TABLE IF EXISTS points_${m}_probe, points_${m}_probe_raw;
CREATE UNLOGGED TABLE points_${m}_probe_raw (id int NOT NULL, lon float8 NOT NULL, lat float8 NOT NULL);
\\copy points_${m}_probe_raw FROM '$DATA/points_${m}_probe.tsv'
CREATE TABLE points_${m}_probe AS
  SELECT id, ST_SetSRID(ST_MakePoint(lon, lat), 4326)::geometry(Point, 4326) AS geom
  FROM points_${m}_probe_raw ORDER BY id;
DROP TABLE points_${m}_probe_raw;
ANALYZE points_${m}_probe;
SQL
done

# ---------------------------------------------------------------------------------------------
RUNS_TSV=$DATA/postgis_runs.tsv
printf '# mix\tvariant\tlabel\tpoints_timed\tsecs_median\tsecs_best\truns\tpairs\tcores\tnote\n' >"$RUNS_TSV"
FAIL=0

median_best() { # seconds... -> "median best"
	printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {printf "%s %s\n", v[int((NR + 1) / 2)], v[1]}'
}

# Exports a query's rows with COPY ... TO STDOUT into FILE; prints the wall-clock seconds.
timed_export() {
	local settings=$1 q=$2 file=$3 t0 t1
	t0=$(date +%s.%N)
	pg -c "$settings" -c "COPY ($q) TO STDOUT" >"$file"
	t1=$(date +%s.%N)
	awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f\n", b - a}'
}

# measure MIX VARIANT LABEL QUERY_FN SETTINGS CORES EXPORT(0/1)
# Warm-up over a tenth of the fixes (which also estimates the full run), then RUNS timed runs of
# "SELECT count(*) FROM (query)" and the median, or a single run when one takes over LONG_RUN
# seconds; in that case, when the pairs are wanted anyway, the single timed run is the export
# itself (COPY of the pairs to a file, whose cost is negligible next to such a run), so that a
# slow variant is not run twice. Variants estimated over MAX_SECS run on a prefix of the fixes.
measure() {
	local m=$1 variant=$2 label=$3 qfn=$4 settings=$5 cores=$6 export=$7
	local warm k note="" s n secs=() mb extra out est exported=0 pairs_file
	pairs_file=$DATA/postgis_${m}_$variant.pairs
	warm=$((POINTS / 10))
	out=$(timed_count "$settings" "$($qfn "$m" "$warm")")
	read -r s n <<<"$out"
	est=$(awk -v s="$s" -v w="$warm" -v n="$POINTS" 'BEGIN {printf "%.1f", s / w * n}')
	log "  $m/$variant: warm-up over $warm fixes: ${s} s (full run estimated at $est s)"
	k=$POINTS
	extra=$(awk -v est="$est" -v w="$warm" -v n="$POINTS" -v max="$MAX_SECS" \
		'BEGIN {k = int(n * max / est); if (k < w) k = w; if (est > max) printf "%d", k}')
	if [ -n "$extra" ]; then
		k=$extra
		note="timed on the first $k fixes (the full $POINTS would take about $est s), rate extrapolated"
		log "  $m/$variant: $note"
		est=$(awk -v e="$est" -v k="$k" -v n="$POINTS" 'BEGIN {printf "%.1f", e * k / n}')
	fi
	if [ "$export" = 1 ] && awk -v e="$est" -v l="$LONG_RUN" 'BEGIN {exit !(e > l)}'; then
		log "  $m/$variant: one timed run, exporting the pairs as it goes"
		s=$(timed_export "$settings" "$($qfn "$m" "$k")" "$pairs_file")
		n=$(wc -l <"$pairs_file")
		secs+=("$s")
		exported=1
		note="${note:+$note; }one run, timed while it wrote its pairs out (COPY)"
		log "  $m/$variant: run 1: ${s} s, $n pairs"
	else
		out=$(timed_count "$settings" "$($qfn "$m" "$k")")
		read -r s n <<<"$out"
		secs+=("$s")
		log "  $m/$variant: run 1: ${s} s, $n pairs"
		if awk -v s="$s" -v l="$LONG_RUN" 'BEGIN {exit !(s < l)}'; then
			for ((r = 2; r <= RUNS; r++)); do
				out=$(timed_count "$settings" "$($qfn "$m" "$k")")
				read -r s n <<<"$out"
				secs+=("$s")
				log "  $m/$variant: run $r: ${s} s"
			done
		fi
	fi
	out=$(median_best "${secs[@]}")
	read -r s mb <<<"$out"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$variant" "$label" "$k" "$s" "$mb" "${#secs[@]}" "$n" "$cores" "$note" >>"$RUNS_TSV"
	{
		echo "== $m / $variant ($label)"
		pg -At <<SQL
$settings
EXPLAIN (COSTS OFF) $($qfn "$m" "$k");
SQL
		echo
	} >>"$DATA/plans.txt"
	if [ "$export" = 1 ]; then
		if [ $exported = 0 ]; then
			log "  $m/$variant: exporting PostGIS's pairs"
			timed_export "$settings" "$($qfn "$m" "$k")" "$pairs_file" >/dev/null
		fi
		local lim=() rc=0
		[ "$k" = "$POINTS" ] || lim=(--limit "$k")
		bench --compare "$DATA" --mix "$m" --variant "$variant" "${lim[@]}" || rc=$?
		case $rc in
		0) ;;
		1) FAIL=1 ;;
		*) die "the comparison of $m/$variant failed (exit $rc)" ;;
		esac
	fi
}

# One query per fix, as a service would ask PostGIS: pgbench, 1 client, prepared statement over
# the Unix socket, a random fix per transaction (uniform over all fixes, with replacement; fixed
# seed). The fix is looked up by primary key inside the statement (pgbench cannot read
# coordinates from a file); the "floor" row times that lookup alone.
per_fix() {
	local m=$1 variant=$2 label=$3 sql=$4 script out tps secs
	script=$DATA/pgbench_${m}_$variant.sql
	cat >"$script" <<SQL
\\set pid random(0, $((POINTS - 1)))
$sql;
SQL
	local bench_args=(-n -M prepared -c 1 -j 1 --random-seed=1 -f "$script" "$DB")
	PGOPTIONS="-c jit=off -c max_parallel_workers_per_gather=0" pgbench -t $(((PER_FIX + 9) / 10)) "${bench_args[@]}" >/dev/null 2>&1 ||
		die "pgbench failed on $script"
	local r all=() mb
	for ((r = 1; r <= RUNS; r++)); do
		out=$(PGOPTIONS="-c jit=off -c max_parallel_workers_per_gather=0" pgbench -t "$PER_FIX" "${bench_args[@]}" 2>&1) ||
			die "pgbench failed on $script: $out"
		tps=$(awk '/^tps = / {print $3; exit}' <<<"$out")
		[ -n "$tps" ] || die "could not read tps from pgbench: $out"
		all+=("$(awk -v t="$tps" -v n="$PER_FIX" 'BEGIN {printf "%.6f", n / t}')")
		log "  $m/$variant: run $r: $PER_FIX queries, $tps per second"
	done
	out=$(median_best "${all[@]}")
	read -r secs mb <<<"$out"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$variant" "$label" "$PER_FIX" "$secs" "$mb" "$RUNS" 0 1 "" >>"$RUNS_TSV"
}

for m in small large; do
	IDX=$(meta_get "tuned_index_$m")
	PIECES=$(meta_get "tuned_pieces_$m")
	log "PostGIS, $m mix"
	measure "$m" plain "PostGIS ST_Covers join, polygons as loaded, GiST" plain_query "$SERIAL" 1 1
	if [ "$(meta_get "tuned_split_$m")" = 1 ]; then DISTINCT_NOTE=", DISTINCT"; else DISTINCT_NOTE=" (none split)"; fi
	measure "$m" tuned "PostGIS ST_Covers join, tuned: ST_Subdivide($SUBDIVIDE) = $PIECES pieces in-line$DISTINCT_NOTE, $IDX" tuned_query "$SERIAL" 1 1
	if [ $PARALLEL = 1 ]; then
		measure "$m" parallel "PostGIS tuned join, parallel ($WORKERS workers + leader on $NPROC cores)" tuned_query "$PARALLEL_SET" "$PAR_CORES" 0
	fi
	if [ "$PER_FIX" -gt 0 ]; then
		FIX="(SELECT geom FROM points_$m WHERE id = :pid)"
		per_fix "$m" perfix_plain "PostGIS, a query per fix (pgbench), polygons as loaded" \
			"SELECT f.id FROM fences_$m f WHERE ST_Covers(f.geom, $FIX)"
		if [ "$(meta_get "tuned_split_$m")" = 1 ]; then D=DISTINCT; else D=; fi
		per_fix "$m" perfix_tuned "PostGIS, a query per fix (pgbench), tuned table" \
			"SELECT $D f.id FROM fences_${m}_tuned f WHERE ST_Covers(f.geom, $FIX)"
		per_fix "$m" perfix_floor "floor of a query per fix: the fix's primary-key lookup alone, no fences" \
			"SELECT geom FROM points_$m WHERE id = :pid"
	fi
done

# Boundary probes: fixes on fence vertices and within an ulp of edges, where an exact predicate
# (geodwell's) and a floating-point one can disagree. Untimed; differences are reported, and only
# fail the run when the exact reference sides with PostGIS (geodwell wrong).
for m in small large; do
	log "boundary probes, $m mix"
	for variant in plain tuned; do
		qfn=${variant}_query
		timed_export "$SERIAL" "$($qfn "$m" 2147483647 "points_${m}_probe")" "$DATA/postgis_${m}_probe_$variant.pairs" >/dev/null
		rc=0
		bench --compare "$DATA" --mix "${m}_probe" --variant "$variant" --informational || rc=$?
		case $rc in
		0) ;;
		1) FAIL=1 ;;
		*) die "the comparison of the $m probes ($variant) failed (exit $rc)" ;;
		esac
	done
done

# ---------------------------------------------------------------------------------------------
{
	printf 'postgis\t%s\n' "$POSTGIS_VERSION"
	printf 'server\t%s\n' "$(pg -Atc 'SELECT version()')"
	for s in shared_buffers effective_cache_size work_mem jit max_parallel_workers_per_gather; do
		printf 'server_%s\t%s\n' "$s" "$(pg -Atc "SHOW $s")"
	done
	pg -At -F $'\t' -c "SELECT key, value FROM bench_meta WHERE key <> 'data' ORDER BY key"
	printf 'nproc\t%s\n' "$NPROC"
	printf 'cpu\t%s\n' "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || echo '?')"
	printf 'loadavg_start\t%s\n' "$LOAD_START"
	printf 'loadavg_end\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
	printf 'finished_utc\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	printf 'command\tbenches/postgis.sh --points %s --max-secs %s --runs %s --per-fix %s --subdivide %s\n' \
		"$POINTS" "$MAX_SECS" "$RUNS" "$PER_FIX" "$SUBDIVIDE"
} >"$DATA/postgis_meta.tsv"
bench --report "$DATA"
echo
echo "plans: $DATA/plans.txt; pair sets and comparisons: $DATA/"
if [ $FAIL != 0 ]; then
	echo "postgis.sh: PostGIS and geodwell disagree on some (fix, fence) pairs: see the compare lines above and $DATA/compare_*.json" >&2
	exit 1
fi
