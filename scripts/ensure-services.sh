#!/usr/bin/env bash
# Start PostgreSQL and Redis on 127.0.0.1 for the distributed test when they are installed but not running,
# installing them from Debian's packages when they are missing and we may (root with apt). Never fatal: without
# them the distributed test skips and says why.
set -u
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if ! command -v pg_ctlcluster >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  if command -v pg_ctlcluster >/dev/null; then
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
    [ -n "$version" ] && pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  fi
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if ! command -v redis-server >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /tmp --logfile /tmp/redis-tokenization-ci.log || true
  fi
fi
pg_isready -h 127.0.0.1 -p 5432 || echo "PostgreSQL is not available: the distributed test will skip"
redis-cli -h 127.0.0.1 -p 6379 ping || echo "Redis is not available: the distributed test will skip"
exit 0
