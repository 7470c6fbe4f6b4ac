"""A real express-rate-limit server for the fleet benchmark (``bench_fleet.py --headers
express``), beside the project's emulation of it (``QuotaServer(quota_headers="express")``).

The server is a small Node script, written to a temporary folder and run with ``node``:
express with ``rateLimit({windowMs, limit, standardHeaders: false, legacyHeaders:
true})`` and its default ``MemoryStore``, on 127.0.0.1 and a free port (it prints ``PORT
<n>``, as the Python servers do). It logs every request with the fields of
``retry_after_adapter.testing.server.LOG_FIELDS`` (times from ``process.hrtime``, which
on Linux is the clock of Python's ``time.monotonic()``), plus what it sent (``Date``,
``X-RateLimit-Reset``), the store's own reset and the arrival in epoch milliseconds
(``Date.now()``), and serves the log at ``GET /__log``.

It needs ``node`` on PATH and the npm packages ``express`` and ``express-rate-limit``
in a ``node_modules`` folder: ``--express-modules DIR`` names it (default: the cache
folder below). Nothing is downloaded unless asked: ``--npm-install`` runs ``npm
install express express-rate-limit`` into the cache folder first. Without them, the real
server's rows are skipped with a message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .common import ServerProcess

#: Where ``--npm-install`` installs the packages, and where they are looked for by default.
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retry-after-adapter-bench"
CACHE_DIR = CACHE_DIR / "express"
PACKAGES = ("express", "express-rate-limit")

#: The server. argv: limit, windowMs. Every request's log entry is LOG_FIELDS, then the
#: extra fields named in EXTRA.
SERVER_JS = r"""
'use strict';
const express = require('express');
const { rateLimit } = require('express-rate-limit');
const limit = Number(process.argv[2]), windowMs = Number(process.argv[3]);
const FIELDS = ['sent_at', 'checked_at', 'arrival', 'reply_at', 'status', 'retry_after', 'client', 'item',
  'window', 'date', 'reset', 'reset_ms', 'now_ms', 'socket'];
const mono = () => Number(process.hrtime.bigint()) / 1e9;
const num = (text) => { const v = Number(text); return text && Number.isFinite(v) ? v : null; };
const log = [], windows = new Map();
let t0 = null, active = 0, maxActive = 0, sockets = 0;
const app = express();
app.use((req, res, next) => {
  if (req.path === '/__log') return next();
  const arrival = mono(), nowMs = Date.now();
  if (t0 === null) t0 = arrival;
  active++; maxActive = Math.max(maxActive, active);
  res.on('finish', () => {
    active--;
    const info = req.rateLimit, reset = info ? info.resetTime.getTime() : null;
    if (reset !== null && !windows.has(reset)) windows.set(reset, windows.size);
    const item = req.get('x-item');
    log.push([num(req.get('x-sent-at')), num(req.get('x-checked-at')), arrival, mono(), res.statusCode,
      Number(res.getHeader('retry-after') || 0), req.get('x-client') ?? null,
      item && /^[0-9]+$/.test(item) ? Number(item) : null, reset === null ? null : windows.get(reset),
      res.getHeader('date') ?? null, res.getHeader('x-ratelimit-reset') ?? null, reset, nowMs,
      req.socket._benchId]);
  });
  next();
});
app.get('/__log', (req, res) => res.json({t0, quota: limit, window: windowMs / 1000, fields: FIELDS, log,
  max_active: maxActive, sockets}));
app.use(rateLimit({windowMs, limit, standardHeaders: false, legacyHeaders: true}));
app.all('/{*rest}', (req, res) => res.type('text/plain').send('ok ' + req.path + '\n'));
const server = app.listen(0, '127.0.0.1', () => console.log('PORT ' + server.address().port));
server.on('connection', (socket) => { socket._benchId = sockets++; });
process.on('SIGTERM', () => process.exit(0));
"""


def modules_dir(given: str | None) -> Path:
    """The ``node_modules`` folder the server's packages are taken from."""
    return Path(given) if given else CACHE_DIR / "node_modules"


def npm_install(target: Path = CACHE_DIR) -> str:
    """``npm install express express-rate-limit`` into ``target`` (asked for by a flag,
    never on import); returns the versions installed."""
    if shutil.which("npm") is None:
        raise RuntimeError("no npm on PATH")
    target.mkdir(parents=True, exist_ok=True)
    if not (target / "package.json").exists():
        (target / "package.json").write_text('{"private": true}\n')
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", *PACKAGES],
        cwd=target,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        timeout=600,
    )
    return versions(target / "node_modules")


def versions(modules: Path) -> str:
    """``express X, express-rate-limit Y`` as installed in ``modules``."""
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {json.loads((modules / name / 'package.json').read_text())['version']}")
        except (OSError, ValueError, KeyError):
            found.append(f"{name} ?")
    return ", ".join(found)


def unavailable(modules: Path) -> str | None:
    """Why the real server's rows are skipped, or None when they can run."""
    if shutil.which("node") is None:
        return "no node on PATH"
    missing = [name for name in PACKAGES if not (modules / name / "package.json").exists()]
    if missing:
        return f"{', '.join(missing)} not in {modules} (--npm-install installs them there)"
    return None


class ExpressServer(ServerProcess):
    """The real server on a free loopback port; ``url`` to reach it. A context manager."""

    def __init__(self, modules: Path, limit: int, window: float, start_timeout: float = 20.0) -> None:
        self.folder = tempfile.mkdtemp(prefix="bench-express-")
        script = Path(self.folder) / "server.js"
        script.write_text(SERVER_JS)
        env = {**os.environ, "NODE_PATH": str(modules.resolve())}
        command = ["node", str(script), str(limit), str(round(window * 1000))]
        self._start(command, "the express server", start_timeout, cwd=self.folder, env=env)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.folder, ignore_errors=True)
