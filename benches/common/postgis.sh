# PostGIS for a bench script: ensure_postgis installs the distribution's PostGIS package for
# the server's PostgreSQL major version if the server lacks it (apt-get, as root or through
# sudo), creates the database $DB if missing, and creates the extension in it. Sourced by
# benches/postgis.sh and benches/queries_postgis.sh, which define pg, pg_admin, log and die
# first (and DB, PGUSER).
ensure_postgis() {
  SERVER_NUM=$(pg_admin -Atc 'SHOW server_version_num')
  PG_MAJOR=$((SERVER_NUM / 10000))
  PKG=postgresql-$PG_MAJOR-postgis-3
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
}

# Available means the extension's files are there and its library loads (a removed package can
# leave the control files behind): try it in a transaction that is rolled back.
has_postgis() {
  [ "$(pg_admin -Atc "SELECT count(*) FROM pg_available_extensions WHERE name = 'postgis'")" != 0 ] &&
    pg_admin -Atc "BEGIN; CREATE EXTENSION IF NOT EXISTS postgis; SELECT postgis_lib_version(); ROLLBACK;" >/dev/null 2>&1
}
