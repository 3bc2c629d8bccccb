#!/usr/bin/env bash
# Make a PostgreSQL server reachable on 127.0.0.1:5432 for the fastrecover tests.
#
# Prints exactly one line on stdout, meant for eval:
#   eval "$(scripts/ensure-postgres.sh)"
#   -> export FASTRECOVER_PG_URL=postgresql+psycopg://fastrecover@127.0.0.1:5432/postgres
# Everything else goes to stderr.
#
# Order of preference:
#   1. $FASTRECOVER_PG_URL already set: echo it, touch nothing.
#   2. A server already answers on 127.0.0.1:5432: make sure role "fastrecover" exists.
#   3. Otherwise: install the server packages if missing (apt-get), initdb a private
#      trust-auth cluster in ${FASTRECOVER_CACHE:-$HOME/.cache/fastrecover}/pgdata, start
#      it with pg_ctl on 127.0.0.1:5432 (socket dir /tmp) and create the role.
# Re-running is cheap: a running cluster is reused, a stopped one is started again.
set -euo pipefail

HOST=127.0.0.1
PORT=5432
ROLE=fastrecover
SOCKET_DIR=/tmp
CACHE_DIR=${FASTRECOVER_CACHE:-$HOME/.cache/fastrecover}
PGDATA_DIR=$CACHE_DIR/pgdata
URL_NOPW="postgresql+psycopg://$ROLE@$HOST:$PORT/postgres"
# Our private cluster only holds throwaway test databases: trade crash safety for speed
# (CREATE DATABASE per test). Never applied to a server we did not start.
THROWAWAY_OPTS="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"

log() { printf 'ensure-postgres: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ -n "${FASTRECOVER_PG_URL:-}" ]]; then
    log "FASTRECOVER_PG_URL already set; using it as is"
    printf 'export FASTRECOVER_PG_URL=%q\n' "$FASTRECOVER_PG_URL"
    exit 0
fi

IS_ROOT=0
[[ $(id -u) -eq 0 ]] && IS_ROOT=1

# Run a command as root (apt-get): directly when root, else through sudo.
as_root() {
    if [[ $IS_ROOT -eq 1 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@" || sudo "$@"
    else
        die "need root to run '$*' and sudo is not available"
    fi
}

# Run a command as the OS user that owns the private cluster: postgres refuses to run as root.
as_pg_owner() {
    if [[ $IS_ROOT -eq 1 ]]; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

pg_bindir() {
    local dir best=""
    for dir in /usr/lib/postgresql/*/bin; do
        [[ -x "$dir/postgres" ]] || continue
        if [[ -z "$best" ]] || [[ $(basename "$(dirname "$dir")") -gt $(basename "$(dirname "$best")") ]]; then
            best=$dir
        fi
    done
    if [[ -z "$best" ]] && command -v pg_config >/dev/null 2>&1; then
        dir=$(pg_config --bindir 2>/dev/null || true)
        [[ -n "$dir" && -x "$dir/postgres" ]] && best=$dir
    fi
    printf '%s' "$best"
}

server_ready() {
    local isready
    isready=$(command -v pg_isready || true)
    [[ -z "$isready" ]] && isready="$(pg_bindir)/pg_isready"
    if [[ -x "$isready" ]]; then
        "$isready" -q -h "$HOST" -p "$PORT" -t 2 >/dev/null 2>&1
    else
        # No client tools yet: a bare TCP probe is enough to decide whether to start a server.
        (exec 3<>"/dev/tcp/$HOST/$PORT") >/dev/null 2>&1
    fi
}

psql_bin() {
    local p
    p=$(command -v psql || true)
    [[ -z "$p" ]] && p="$(pg_bindir)/psql"
    printf '%s' "$p"
}

# Can we log in as $ROLE over TCP without a password (trust)?
role_works_trust() {
    PGCONNECT_TIMEOUT=5 "$(psql_bin)" -X -q -w -h "$HOST" -p "$PORT" -U "$ROLE" -d postgres -tAc 'SELECT 1' \
        >/dev/null 2>&1
}

# Run SQL as a superuser of the server on $PORT, whichever way this machine allows.
run_admin_sql() {
    local sql=$1 psql
    psql=$(psql_bin)
    # trust over TCP as postgres (our own cluster, CI services)
    if PGCONNECT_TIMEOUT=5 "$psql" -X -q -w -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U postgres -d postgres \
        -c "$sql" >/dev/null 2>&1; then
        return 0
    fi
    # peer auth over a unix socket as the postgres OS user (distribution packages)
    local sock
    for sock in /var/run/postgresql "$SOCKET_DIR"; do
        [[ -S "$sock/.s.PGSQL.$PORT" ]] || continue
        if [[ $IS_ROOT -eq 1 ]] && id postgres >/dev/null 2>&1; then
            (cd / && runuser -u postgres -- "$psql" -X -q -v ON_ERROR_STOP=1 -h "$sock" -p "$PORT" -d postgres \
                -c "$sql") >/dev/null 2>&1 && return 0
        elif command -v sudo >/dev/null 2>&1; then
            (cd / && sudo -n -u postgres "$psql" -X -q -v ON_ERROR_STOP=1 -h "$sock" -p "$PORT" -d postgres \
                -c "$sql") >/dev/null 2>&1 && return 0
        fi
        # the current OS user may itself be a superuser (e.g. it ran initdb)
        "$psql" -X -q -w -v ON_ERROR_STOP=1 -h "$sock" -p "$PORT" -d postgres -c "$sql" >/dev/null 2>&1 \
            && return 0
    done
    return 1
}

ensure_role() {
    if role_works_trust; then
        log "role $ROLE can log in on $HOST:$PORT"
        printf 'export FASTRECOVER_PG_URL=%s\n' "$URL_NOPW"
        return 0
    fi
    log "creating role $ROLE (superuser, login) on $HOST:$PORT"
    local create="DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
            CREATE ROLE $ROLE LOGIN SUPERUSER;
        END IF;
        ALTER ROLE $ROLE LOGIN SUPERUSER PASSWORD '$ROLE';
    END \$\$;"
    run_admin_sql "$create" || die "cannot create role $ROLE on $HOST:$PORT: no superuser access \
(tried trust as postgres over TCP and peer auth via runuser/sudo). Create it yourself:
    CREATE ROLE $ROLE LOGIN SUPERUSER PASSWORD '$ROLE';
or export FASTRECOVER_PG_URL to a server you can use."
    if role_works_trust; then
        printf 'export FASTRECOVER_PG_URL=%s\n' "$URL_NOPW"
    elif PGPASSWORD=$ROLE PGCONNECT_TIMEOUT=5 "$(psql_bin)" -X -q -w -h "$HOST" -p "$PORT" -U "$ROLE" \
        -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; then
        # An existing server that wants passwords over TCP (Debian's default pg_hba).
        log "server requires a password over TCP; using password '$ROLE'"
        printf 'export FASTRECOVER_PG_URL=%s\n' "postgresql+psycopg://$ROLE:$ROLE@$HOST:$PORT/postgres"
    else
        die "role $ROLE exists but cannot log in on $HOST:$PORT (check pg_hba.conf)"
    fi
}

install_server() {
    command -v apt-get >/dev/null 2>&1 || die "PostgreSQL server binaries not found and apt-get is not available; \
install PostgreSQL (>= 13) or export FASTRECOVER_PG_URL"
    log "PostgreSQL server binaries not found; installing the postgresql package (apt-get)"
    as_root apt-get update >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >&2
}

# postgres must be able to reach its data directory; as root under a 0700 $HOME it cannot.
# Walk from / downwards so each check sees its parents already fixed.
grant_traversal() {
    local dir="" part
    local -a parts
    IFS=/ read -r -a parts <<<"${1#/}"
    for part in "${parts[@]}"; do
        [[ -n "$part" ]] || continue
        dir="$dir/$part"
        if ! runuser -u postgres -- test -x "$dir" 2>/dev/null; then
            log "granting search (o+x, not read) permission on $dir so the postgres user can reach $PGDATA_DIR"
            chmod o+x "$dir"
        fi
    done
}

start_private_cluster() {
    local bindir
    bindir=$(pg_bindir)
    if [[ -z "$bindir" ]]; then
        install_server
        bindir=$(pg_bindir)
        [[ -n "$bindir" ]] || die "postgresql installed but no server binaries under /usr/lib/postgresql/*/bin"
    fi
    if [[ $IS_ROOT -eq 1 ]]; then
        id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' OS user to run the server"
    fi
    mkdir -p "$CACHE_DIR"
    PGDATA_DIR=$(cd "$CACHE_DIR" && pwd -P)/pgdata
    if [[ $IS_ROOT -eq 1 ]]; then
        grant_traversal "$(dirname "$PGDATA_DIR")"
    fi

    if [[ ! -s "$PGDATA_DIR/PG_VERSION" ]]; then
        log "initialising a trust-auth cluster in $PGDATA_DIR with $bindir/initdb"
        rm -rf "$PGDATA_DIR"
        mkdir -p "$PGDATA_DIR"
        chmod 0700 "$PGDATA_DIR"
        [[ $IS_ROOT -eq 1 ]] && chown postgres:postgres "$PGDATA_DIR"
        as_pg_owner "$bindir/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust --encoding=UTF8 \
            --no-locale >&2
    else
        local version
        version=$(cat "$PGDATA_DIR/PG_VERSION")
        if [[ "$version" != "$(basename "$(dirname "$bindir")")" ]]; then
            if [[ -x "/usr/lib/postgresql/$version/bin/postgres" ]]; then
                bindir=/usr/lib/postgresql/$version/bin
            else
                die "$PGDATA_DIR is a PostgreSQL $version cluster but only $bindir is installed; \
remove $PGDATA_DIR to re-create it"
            fi
        fi
        log "reusing the cluster in $PGDATA_DIR (PostgreSQL $version)"
    fi

    if as_pg_owner "$bindir/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
        log "cluster in $PGDATA_DIR is running but not answering on $HOST:$PORT; restarting it"
        as_pg_owner "$bindir/pg_ctl" -D "$PGDATA_DIR" -m fast -w stop >&2 || true
    fi
    log "starting PostgreSQL on $HOST:$PORT (log: $PGDATA_DIR/server.log)"
    if ! as_pg_owner "$bindir/pg_ctl" -D "$PGDATA_DIR" -l "$PGDATA_DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=$HOST -p $PORT -k $SOCKET_DIR $THROWAWAY_OPTS" start >&2; then
        tail -n 20 "$PGDATA_DIR/server.log" >&2 || true
        die "PostgreSQL did not start; see $PGDATA_DIR/server.log (is port $PORT taken?)"
    fi
    local i
    for i in $(seq 1 60); do
        server_ready && return 0
        sleep 0.5
    done
    die "PostgreSQL started but does not answer on $HOST:$PORT"
}

if server_ready; then
    log "a PostgreSQL server answers on $HOST:$PORT"
else
    start_private_cluster
fi
ensure_role
