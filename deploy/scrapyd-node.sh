#!/usr/bin/env bash
# Prepare one crawler node for scrapyd deployment (run as root on the node, from
# a checkout or a copy of this repository's requirements files and deploy/):
#   sudo bash deploy/scrapyd-node.sh
# What it does: a 'scrapyd' system user; /opt/crawlproject/venv with scrapyd and
# the project's pinned runtime requirements (an egg installs no dependencies:
# they must be in scrapyd's virtualenv); the system Chromium; /etc/scrapyd/scrapyd.conf;
# /etc/crawlproject/scrapyd.env (mode 600, filled in by you: credentials and the
# Redis/MongoDB addresses, never in the repository); the systemd unit.
# Re-running it upgrades the requirements and keeps an existing env file.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=/opt/crawlproject/venv
SCRAPYD_VERSION="$(grep -E '^scrapyd==' requirements-dev.txt | cut -d= -f3)"

id scrapyd >/dev/null 2>&1 || useradd --system --home-dir /var/lib/scrapyd --shell /usr/sbin/nologin scrapyd
install -d -o scrapyd -g scrapyd /var/lib/scrapyd /var/lib/scrapyd/eggs /var/lib/scrapyd/dbs /var/log/scrapyd
install -d /etc/scrapyd /etc/crawlproject
if command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv chromium >/dev/null
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r requirements.txt "scrapyd==$SCRAPYD_VERSION"
install -m 644 deploy/scrapyd.conf /etc/scrapyd/scrapyd.conf
if [ ! -e /etc/crawlproject/scrapyd.env ]; then
  install -m 600 /dev/null /etc/crawlproject/scrapyd.env
  cat > /etc/crawlproject/scrapyd.env <<'ENV'
SCRAPYD_USERNAME=crawl
SCRAPYD_PASSWORD=
REDIS_URL=redis://redis.internal:6379/0
MONGO_URI=mongodb://mongo.internal:27017/
MONGO_DATABASE=crawl
ENV
  echo "Fill in /etc/crawlproject/scrapyd.env (SCRAPYD_PASSWORD is empty), then: systemctl enable --now scrapyd"
fi
install -m 644 deploy/scrapyd.service /etc/systemd/system/scrapyd.service
command -v systemctl >/dev/null && systemctl daemon-reload || true
