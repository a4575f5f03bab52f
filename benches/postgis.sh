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
LONG_RUN=60 # seconds: a variant whose first timed run is longer gets only that run

die() {
	echo "postgis.sh: error: $*" >&2
	exit 3
}
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
trap 'echo "postgis.sh: failed at line $LINENO (exit $?): $BASH_COMMAND" >&2' ERR

pg() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
pg_admin() { psql -X -q -v ON_ERROR_STOP=1 -d "${PGADMINDB:-postgres}" "$@"; }

# Session settings of every single-core timing: no parallel workers (one core), no JIT (it
# compiled ~50 ms of expressions and gained nothing on these function-call-bound plans), enough
# work_mem for the DISTINCT of the subdivided variant to hash in memory.
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
SERVER_NUM=$(pg_admin -Atc 'SHOW server_version_num')
PG_MAJOR=$((SERVER_NUM / 10000))
PKG=postgresql-$PG_MAJOR-postgis-3

has_postgis() { [ "$(pg_admin -Atc "SELECT count(*) FROM pg_available_extensions WHERE name = 'postgis'")" != 0 ]; }
if has_postgis; then
	log "PostGIS is available to PostgreSQL $PG_MAJOR"
else
	log "PostGIS missing: installing $PKG"
	SUDO=
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || die "PostGIS is not installed and we are not root: run 'apt-get install $PKG' as root"
		SUDO=sudo
	fi
	command -v apt-get >/dev/null || die "PostGIS is not installed and apt-get is unavailable: install PostGIS for PostgreSQL $PG_MAJOR"
	if ! apt-cache show "$PKG" >/dev/null 2>&1; then
		$SUDO apt-get update -qq || die "apt-get update failed"
	fi
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$PKG" >/dev/null || die "apt-get install $PKG failed"
	has_postgis || die "$PKG installed but the server does not list the postgis extension"
fi
if [ "$(pg_admin -Atc "SELECT count(*) FROM pg_database WHERE datname = '$DB'")" = 0 ]; then
	log "creating database $DB"
	pg_admin -c "CREATE DATABASE $DB"
fi
pg -c 'CREATE EXTENSION IF NOT EXISTS postgis'
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
cargo bench --bench postgis --no-run -q 2>/dev/null || cargo bench --bench postgis --no-run
bench() { cargo bench -q --bench postgis -- "$@"; }
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

plain_query() { echo "SELECT p.id AS point, f.id AS fence FROM points_$1 p JOIN fences_$1 f ON ST_Covers(f.geom, p.geom) WHERE p.id < $2"; }
tuned_query() { echo "SELECT DISTINCT p.id AS point, f.id AS fence FROM points_$1 p JOIN fences_$1_tuned f ON ST_Covers(f.geom, p.geom) WHERE p.id < $2"; }

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

# ---------------------------------------------------------------------------------------------
RUNS_TSV=$DATA/postgis_runs.tsv
printf '# mix\tvariant\tlabel\tpoints_timed\tsecs_median\tsecs_best\truns\tpairs\tcores\tnote\n' >"$RUNS_TSV"
FAIL=0

median_best() { # seconds... -> "median best"
	printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {printf "%s %s\n", v[int((NR + 1) / 2)], v[1]}'
}

# measure MIX VARIANT LABEL QUERY_FN SETTINGS CORES EXPORT(0/1)
measure() {
	local m=$1 variant=$2 label=$3 qfn=$4 settings=$5 cores=$6 export=$7
	local warm k note="" s n secs=() mb extra out
	warm=$((POINTS / 10))
	out=$(timed_count "$settings" "$($qfn "$m" "$warm")")
	read -r s n <<<"$out"
	log "  $m/$variant: warm-up over $warm fixes: ${s} s"
	k=$POINTS
	extra=$(awk -v s="$s" -v w="$warm" -v n="$POINTS" -v max="$MAX_SECS" \
		'BEGIN {est = s / w * n; k = int(n * max / est); if (k < w) k = w; if (est > max) printf "%d %.0f", k, est; else print ""}')
	if [ -n "$extra" ]; then
		k=${extra%% *}
		note="timed on the first $k fixes: the full $POINTS would take about ${extra#* } s; rate extrapolated"
		log "  $m/$variant: $note"
	fi
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
		log "  $m/$variant: exporting PostGIS's pairs and comparing with geodwell's"
		pg <<SQL
$settings
\\copy ($($qfn "$m" "$k")) TO '$DATA/postgis_${m}_$variant.pairs'
SQL
		local lim=()
		[ "$k" = "$POINTS" ] || lim=(--limit "$k")
		local rc=0
		bench --compare "$DATA" --mix "$m" --variant "$variant" "${lim[@]}" || rc=$?
		case $rc in
		0) ;;
		1) FAIL=1 ;;
		*) die "the comparison of $m/$variant failed (exit $rc)" ;;
		esac
	fi
}

# One query per fix, as a service would ask PostGIS: pgbench, 1 client, prepared statement, a
# random fix (by primary key) per transaction.
per_fix() {
	local m=$1 variant=$2 label=$3 table=$4 distinct=$5 script out tps secs
	script=$DATA/pgbench_${m}_$variant.sql
	cat >"$script" <<SQL
\\set pid random(0, $((POINTS - 1)))
SELECT $distinct f.id FROM $table f WHERE ST_Covers(f.geom, (SELECT geom FROM points_$m WHERE id = :pid));
SQL
	local bench_args=(-n -M prepared -c 1 -j 1 --random-seed=1 -f "$script" "$DB")
	PGOPTIONS="-c jit=off -c max_parallel_workers_per_gather=0" pgbench -t $(((PER_FIX + 9) / 10)) "${bench_args[@]}" >/dev/null 2>&1 ||
		die "pgbench failed on $script"
	out=$(PGOPTIONS="-c jit=off -c max_parallel_workers_per_gather=0" pgbench -t "$PER_FIX" "${bench_args[@]}" 2>&1) ||
		die "pgbench failed on $script: $out"
	tps=$(awk '/^tps = / {print $3; exit}' <<<"$out")
	[ -n "$tps" ] || die "could not read tps from pgbench: $out"
	secs=$(awk -v t="$tps" -v n="$PER_FIX" 'BEGIN {printf "%.6f", n / t}')
	log "  $m/$variant: $PER_FIX queries, $tps per second"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$variant" "$label" "$PER_FIX" "$secs" "$secs" 1 0 1 \
		"random fixes with replacement, one prepared statement each over a Unix socket; includes a primary-key lookup of the fix" >>"$RUNS_TSV"
}

for m in small large; do
	IDX=$(meta_get "tuned_index_$m")
	PIECES=$(meta_get "tuned_pieces_$m")
	log "PostGIS, $m mix"
	measure "$m" plain "PostGIS ST_Covers, one GiST index, polygons as loaded" plain_query "$SERIAL" 1 1
	measure "$m" tuned "PostGIS tuned: ST_Subdivide($SUBDIVIDE) into $PIECES pieces stored in-line, $IDX index, DISTINCT" tuned_query "$SERIAL" 1 1
	if [ $PARALLEL = 1 ]; then
		measure "$m" parallel "PostGIS tuned, parallel query ($WORKERS workers + leader on $NPROC cores)" tuned_query "$PARALLEL_SET" "$PAR_CORES" 0
	fi
	if [ "$PER_FIX" -gt 0 ]; then
		per_fix "$m" perfix_plain "PostGIS query per fix (pgbench), polygons as loaded" "fences_$m" ""
		per_fix "$m" perfix_tuned "PostGIS query per fix (pgbench), tuned table" "fences_${m}_tuned" DISTINCT
	fi
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
