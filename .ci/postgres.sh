#!/usr/bin/env bash
# Start a local PostgreSQL for the tests that run an MLflow server on a Postgres backend.
#
# For a fresh Debian 12 machine, as root. Idempotent: safe to run again (it then only checks).
#   - installs Debian's `postgresql` if no server binary is there,
#   - starts (creating it if there is none) a cluster listening on 127.0.0.1,
#   - creates role `mlflow` (password `mlflow`, CREATEDB for scratch databases) and database
#     `mlflow_neuron_test` owned by it.
# Usage (everything but the final export line goes to stderr):
#   eval "$(bash .ci/postgres.sh)"
# which sets MLFLOW_NEURON_TEST_POSTGRES_URI for the tests (tests/servers.py: postgres_uri()).
# The MLflow server also needs a Python driver: with SQLAlchemy >= 2.1 a postgresql:// URI means
# psycopg 3, i.e. pip package `psycopg[binary]` (for psycopg2 the URI would be postgresql+psycopg2://).
set -euo pipefail

ROLE=mlflow
PASSWORD=mlflow
DB=mlflow_neuron_test
CLUSTER=${MLFLOW_NEURON_PG_CLUSTER:-main}  # Debian cluster name; "main" unless testing this script

log() { echo "postgres.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Everything below talks on stderr; only the final `export` line goes to stdout (kept on fd 3).
exec 3>&1 1>&2

detached() {
    # Run "$@" with every descriptor above 2 closed: the server it starts outlives this script and
    # must not hold the stdout pipe of `$(bash .ci/postgres.sh)` open, or the caller waits forever.
    (
        for fd in /proc/self/fd/*; do
            n=${fd##*/}
            if [ "$n" -gt 2 ] 2>/dev/null; then exec {n}>&- 2>/dev/null || true; fi
        done
        exec "$@"
    )
}

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and runs commands as user postgres)"
cd /  # the postgres user may not be able to enter the caller's directory
export LC_ALL=C.UTF-8 LANG=C.UTF-8  # always present on Debian 12; used by a new cluster's initdb

server_binary() {
    # Newest installed major version that has a server binary; empty if none.
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -t/ -k5,5n | tail -n 1 || true)
    [ -n "$bin" ] && basename "$(dirname "$(dirname "$bin")")"
    return 0
}

VER=$(server_binary)
if [ -z "$VER" ] || ! command -v pg_ctlcluster >/dev/null; then
    log "installing PostgreSQL from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    detached timeout 600 apt-get update -qq || die "apt-get update failed"
    detached timeout 900 apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends postgresql >/dev/null \
        || die "apt-get install postgresql failed"
    VER=$(server_binary)
    [ -n "$VER" ] || die "no /usr/lib/postgresql/*/bin/postgres after installing postgresql"
fi
log "PostgreSQL $VER"

as_postgres() {
    if command -v runuser >/dev/null; then
        runuser -u postgres -- "$@"
    else
        su -s /bin/sh postgres -c "$(printf '%q ' "$@")"
    fi
}

cluster_field() {  # cluster_field COLUMN: from `pg_lsclusters` for $VER/$CLUSTER (3 port, 4 status)
    pg_lsclusters -h 2>/dev/null | awk -v v="$VER" -v cl="$CLUSTER" -v c="$1" '$1 == v && $2 == cl {print $c}'
}

if [ -z "$(cluster_field 2)" ]; then
    log "creating cluster $VER/$CLUSTER"
    detached pg_createcluster "$VER" "$CLUSTER" || die "pg_createcluster $VER $CLUSTER failed"
fi

PORT=$(cluster_field 3)
[ -n "$PORT" ] || die "cannot find the port of cluster $VER/$CLUSTER"

STATUS=$(cluster_field 4)
if [ "${STATUS#online}" = "$STATUS" ]; then  # not "online" (nor "online,recovery")
    log "starting cluster $VER/$CLUSTER on port $PORT"
    # Debian's default listen_addresses is 'localhost' (127.0.0.1 and ::1); make 127.0.0.1 certain.
    detached pg_ctlcluster "$VER" "$CLUSTER" start -- -o "-c listen_addresses=127.0.0.1" \
        || { tail -n 30 "/var/log/postgresql/postgresql-$VER-$CLUSTER.log" >&2 2>/dev/null || true
             die "pg_ctlcluster $VER $CLUSTER start failed"; }
fi

ready=
for _ in $(seq 1 60); do
    if pg_isready -q -h 127.0.0.1 -p "$PORT" -t 2; then ready=1; break; fi
    sleep 1
done
[ -n "$ready" ] || die "PostgreSQL is not accepting connections on 127.0.0.1:$PORT after 60 s"

psql_admin() {
    as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres "$@"
}

psql_admin <<SQL || die "creating role $ROLE failed"
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
        CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
    ELSE
        ALTER ROLE $ROLE WITH LOGIN CREATEDB PASSWORD '$PASSWORD';
    END IF;
END
\$\$;
SQL

if [ "$(psql_admin -tA -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
    log "creating database $DB"
    as_postgres createdb -p "$PORT" -O "$ROLE" "$DB" || die "createdb $DB failed"
else
    psql_admin -c "ALTER DATABASE $DB OWNER TO $ROLE" || die "ALTER DATABASE $DB failed"
fi

URI="postgresql://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
# Check the way the tests will connect: TCP on 127.0.0.1 with the password.
PGPASSWORD=$PASSWORD psql -X -q -h 127.0.0.1 -p "$PORT" -U "$ROLE" -d "$DB" -tA -c "SELECT 1" >/dev/null \
    || die "cannot log in as $ROLE over TCP on 127.0.0.1:$PORT"
log "ready: $URI"

echo "export MLFLOW_NEURON_TEST_POSTGRES_URI=$URI" >&3
