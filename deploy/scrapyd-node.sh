#!/usr/bin/env bash
# Prepare one crawler node for scrapyd deployment (from a checkout, or a copy of
# this repository's requirements files, deploy/ and crawlproject/scrapyd_launcher.py).
#
#   sudo bash deploy/scrapyd-node.sh                      # production: as root, systemd
#   bash deploy/scrapyd-node.sh --prefix DIR --no-systemd [--bind ADDR] [--port N]
#
# Production (no options): a 'scrapyd' system user; /opt/crawlproject/venv with
# scrapyd, the project's hashed runtime lock (an egg installs no dependencies:
# they must be in scrapyd's virtualenv) and scrapyd's launcher for the project
# (stopping scrapyd closes its jobs; no start without credentials, on any
# address); the system Chromium; /etc/scrapyd/scrapyd.conf;
# /etc/crawlproject/scrapyd.env (mode 600: SCRAPYD_USERNAME and a generated
# SCRAPYD_PASSWORD, one per node, and the Redis/MongoDB addresses you fill in;
# never in the repository); the systemd unit. Re-running it upgrades the requirements and
# the launcher and keeps an existing env file.
#
# Options:
#   --prefix DIR   everything in DIR instead of /opt, /etc and /var: DIR/venv,
#                  DIR/scrapyd.conf (eggs, dbs, logs under DIR), DIR/scrapyd.env,
#                  and DIR/run-scrapyd, which starts scrapyd in DIR with that env
#                  (no system user, no systemd unit)
#   --no-systemd   no system user, no systemd unit, no apt-get (python3-venv and
#                  Chromium must be there): with --prefix, runs unprivileged;
#                  alone, /opt/crawlproject/run-scrapyd starts scrapyd
#   --bind ADDR    scrapyd's bind_address (default: deploy/scrapyd.conf's, 0.0.0.0)
#   --port N       scrapyd's http_port (default: 6800)
#   -h, --help     this text
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV=/opt/crawlproject/venv
PREFIX=""
SYSTEMD=1
BIND=""
PORT=""
# The comment block above, without its "# ".
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "scrapyd-node.sh: $1" >&2; usage >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || fail "--prefix needs a directory"; PREFIX="$2"; shift 2 ;;
    --no-systemd) SYSTEMD=0; shift ;;
    --bind) [ $# -ge 2 ] || fail "--bind needs an address"; BIND="$2"; shift 2 ;;
    --port) [ $# -ge 2 ] || fail "--port needs a number"; PORT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) fail "unknown option $1" ;;
  esac
done
if [ -n "$PREFIX" ]; then  # relative to where the script was run from
  mkdir -p "$PREFIX"
  PREFIX="$(cd "$PREFIX" && pwd)"
fi
cd "$(dirname "$0")/.."

if [ -n "$PREFIX" ]; then
  VENV="$PREFIX/venv"
  CONF="$PREFIX/scrapyd.conf"
  ENV_FILE="$PREFIX/scrapyd.env"
  WORKDIR="$PREFIX"
  install -d "$PREFIX/eggs" "$PREFIX/dbs" "$PREFIX/logs"
else
  CONF=/etc/scrapyd/scrapyd.conf
  ENV_FILE=/etc/crawlproject/scrapyd.env
  WORKDIR=/var/lib/scrapyd
  install -d /etc/scrapyd /etc/crawlproject
fi
# The system user and the unit: production without a prefix.
UNIT=0
[ "$SYSTEMD" = 1 ] && [ -z "$PREFIX" ] && UNIT=1
if [ "$UNIT" = 1 ]; then
  id scrapyd >/dev/null 2>&1 || useradd --system --home-dir /var/lib/scrapyd --shell /usr/sbin/nologin scrapyd
  install -d -o scrapyd -g scrapyd /var/lib/scrapyd /var/lib/scrapyd/eggs /var/lib/scrapyd/dbs /var/log/scrapyd
elif [ -z "$PREFIX" ]; then
  install -d /var/lib/scrapyd /var/lib/scrapyd/eggs /var/lib/scrapyd/dbs /var/log/scrapyd
fi
if [ "$SYSTEMD" = 1 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv chromium >/dev/null
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# The hashed node lock (CPython 3.11, Linux x86_64) with the extras the project's
# spiders and settings use (items, metrics) and scrapyd, each hashed
# (requirements/EXTRA.txt: deploy/lock.sh). The project comes as the egg.
"$VENV/bin/python" -m pip install -q --require-hashes -r requirements.txt \
  -r requirements/items.txt -r requirements/metrics.txt -r requirements/scrapyd.txt
"$VENV/bin/python" -m pip check >/dev/null
# scrapyd's launcher (deploy/scrapyd.conf names it): a module of its own in
# scrapyd's virtualenv, not the package (the jobs take crawlproject from the egg).
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
install -m 644 crawlproject/scrapyd_launcher.py "$SITE/crawlproject_scrapyd_launcher.py"

if [ -z "$PREFIX" ]; then
  install -m 644 deploy/scrapyd.conf /etc/scrapyd/scrapyd.conf
else  # the same file, with its data directories under the prefix
  sed -e "s#^eggs_dir .*#eggs_dir     = $PREFIX/eggs#" -e "s#^dbs_dir .*#dbs_dir      = $PREFIX/dbs#" \
      -e "s#^logs_dir .*#logs_dir     = $PREFIX/logs#" deploy/scrapyd.conf > "$CONF"
fi
[ -z "$BIND" ] || sed -i "s#^bind_address .*#bind_address = $BIND#" "$CONF"
[ -z "$PORT" ] || sed -i "s#^http_port .*#http_port    = $PORT#" "$CONF"
if [ ! -e "$ENV_FILE" ]; then
  # A password of its own for this node (never printed): crawlctl reads each
  # node's from a credentials file named on the node's line of the targets file.
  PASSWORD="$("$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(24))')"
  install -m 600 /dev/null "$ENV_FILE"
  {
    printf 'SCRAPYD_USERNAME=crawl\nSCRAPYD_PASSWORD=%s\n' "$PASSWORD"
    # The crawl's secret, the same on every node (never generated here: one
    # per node would let no node prove what another stored).
    printf 'FRONTIER_SECRET=%s\n' "${FRONTIER_SECRET:-}"
    cat <<'ENV'
REDIS_URL=redis://redis.internal:6379/0
MONGO_URI=mongodb://mongo.internal:27017/
MONGO_DATABASE=crawl
ENV
  } > "$ENV_FILE"
  echo "Generated scrapyd's credentials (user crawl, a random password) in $ENV_FILE (mode 600)"
  echo "For crawlctl: copy its SCRAPYD_USERNAME and SCRAPYD_PASSWORD lines into a file of" \
    "mode 600 on the operator's machine and name it on this node's line of the targets" \
    "file: NAME URL CREDENTIALS_FILE"
  echo "Fill in REDIS_URL, MONGO_URI and MONGO_DATABASE in $ENV_FILE, then start scrapyd"
  [ -n "${FRONTIER_SECRET:-}" ] || echo "Set FRONTIER_SECRET in $ENV_FILE, the same on every node" \
    "(crawlctl secret prints one; or run this script with FRONTIER_SECRET exported)"
elif ! grep -Eq '^SCRAPYD_PASSWORD=.+' "$ENV_FILE"; then  # kept from an older run
  echo "WARNING: no SCRAPYD_PASSWORD in $ENV_FILE: scrapyd refuses to start without it," \
       "on any address, loopback too (set one, e.g. openssl rand -base64 24)" >&2
fi
if [ "$UNIT" = 1 ]; then
  install -m 644 deploy/scrapyd.service /etc/systemd/system/scrapyd.service
  command -v systemctl >/dev/null && systemctl daemon-reload || true
  echo "Start with: systemctl enable --now scrapyd"
else
  # What the systemd unit does, without systemd: the env file, the working
  # directory (scrapyd.conf is read from it; the MongoDB spool lives in it), scrapyd.
  LAUNCHER="${PREFIX:-/opt/crawlproject}/run-scrapyd"
  cat > "$LAUNCHER" <<RUN
#!/usr/bin/env bash
set -euo pipefail
cd "$WORKDIR"
set -a; . "$ENV_FILE"; set +a
export CHROMIUM_PATH="\${CHROMIUM_PATH:-/usr/lib/chromium/chromium}"
exec "$VENV/bin/scrapyd" "\$@"
RUN
  chmod 755 "$LAUNCHER"
  echo "Start with: $LAUNCHER"
fi
