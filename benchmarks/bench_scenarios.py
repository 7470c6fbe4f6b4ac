"""How a fleet fares when the server changes its mind: scripted scenarios, three fleets.

Each scenario is a script for the package's ``ScenarioServer`` (a loopback HTTP server,
``retry_after_adapter.testing.scenarios``): phases over time, each with one behaviour.
The full run has ten (``--quick``: three short ones):

- sporadic: 429 ``Retry-After: 1`` on every 25th request, four times, in the first 5 s;
  then 200s;
- deploy: every answer 503 ``Retry-After: 2`` for 3 s, then 200s;
- storm, storm-ra0: every answer 429 without Retry-After (or with ``Retry-After: 0``)
  for 5 s, then 200s;
- alternating: 429 ``Retry-After: 1`` and 200 by turns for 6 s, then 200s;
- rising: a fixed window of 20 per 2 s, 80 per 2 s from 8 s on; not announced;
- falling: 80 per 2 s, 20 per 2 s from 8 s on; not announced;
- fixed, sliding: 50 per 5 s in fixed windows, or in any 5 s (a sliding log); not
  announced;
- fixed-ietf: 50 per 5 s in fixed windows, announced in IETF ``RateLimit`` fields.

Every scenario runs three fleets, each against a fresh server, each of THREADS worker
threads (32; each its own ``requests.Session``) that loop until the scenario's end: GET;
when the call was deferred, sleep until its ``eligible_at`` (never past the end).

- stock: ``HTTPAdapter(max_retries=Retry(total=10, backoff_factor=0.5,
  status_forcelist=(429, 502, 503, 504), respect_retry_after_header=True))``;
- defaults: ``RetryAfterAdapter(max_retries=RetryAfterRetry(the same, deadline=3,
  attempt_reserve=0.2), max_concurrency=8)``, a fresh ``MemoryCooldownStore`` per run,
  everything else as shipped (the learned rate on);
- best: what a user who knows the server would configure: ``learn_rate=False`` for a
  server without a quota, the ``Quota`` for a known quota (for rising and falling, the
  one it ends on).

Reported per run:

- goodput: 2xx answers per second from the transient's end (the last phase's start) +
  max(5 s, 3 of its windows) to the scenario's end (``--quick``: max(1 s, 3 windows));
  beside it the stock run's, and what the server allowed there: a quota's limit per
  window, or, for a server without one, the best configuration's goodput in the same
  run (the same fleet, 8 connections, without the learned rate: stock's 32 connections
  measure the machine, not the learned rate); their ratio;
- 429s and 5xx answers, requests sent early (while a cooldown the server announced was
  running, 0.25 s after the announcement on) and, of those, the ones the store had
  already learned of when it admitted them (a defect; the others were admitted before
  the answer reached the store), overruns (windows of a quota in which more requests
  arrived than its limit), and 2xx answers per second over the whole run;
- the learned rate of the server's origin, sampled every 0.1 s from the store
  (``rate_of``: whatever numeric fields its record has, kept at each change).

Each scenario is also drawn, one lane per fleet, into
``<out>/scenario-<name>.svg``: requests per 100 ms by status, the cooldowns the server
announced, the learned rate and the quota's rate (both as requests per 100 ms).

    python benchmarks/bench_scenarios.py            # ten scenarios, about 13 minutes
    python benchmarks/bench_scenarios.py --quick    # three short ones, under a minute
    python benchmarks/bench_scenarios.py --only storm,fixed
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from xml.sax.saxutils import escape

import requests
from lib import common as _common
from lib import fleet as _fleet
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from retry_after_adapter import (
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
    RetryDeferred,
    deferral_of,
)
from retry_after_adapter.testing.scenarios import (
    Phase,
    ScenarioServer,
    all_status,
    every_nth,
    fixed_window,
    healthy,
    sliding_window,
    storm,
)

FLEETS = ("stock", "defaults", "best")
STATUSES = (429, 502, 503, 504)
TOTAL = 10
BACKOFF = 0.5
DEADLINE = 3.0
ATTEMPT_RESERVE = 0.2
MAX_CONCURRENCY = 8
#: Seconds between two looks at the learned rate.
SAMPLE_EVERY = 0.1
#: Seconds of a bar in the pictures.
BUCKET = 0.1


@dataclass(frozen=True)
class Scenario:
    """A script, how long a run of it lasts (seconds) and the best fleet's adapter
    keywords (``best``, described by ``best_label``)."""

    name: str
    phases: tuple[Phase, ...]
    seconds: float
    best: dict[str, Any]
    best_label: str

    def window(self) -> float:
        """The last phase's window in seconds (0 without one)."""
        return float(getattr(self.phases[-1].behaviour, "window", 0.0))


def _no_quota(name: str, phases: tuple[Phase, ...], seconds: float) -> Scenario:
    return Scenario(name, phases, seconds, {"learn_rate": False}, "learn_rate=False")


def _quota(name: str, phases: tuple[Phase, ...], seconds: float, limit: int, per: float) -> Scenario:
    return Scenario(name, phases, seconds, {"quota": Quota(limit, per=per)}, f"Quota({limit}, per={per:g})")


def scenarios(quick: bool) -> list[Scenario]:
    """The scripts of a full run, or of a quick one."""
    if quick:
        return [
            _no_quota("sporadic", (Phase(every_nth(10, 429, "1", times=2), 1.0), Phase(healthy())), 3.0),
            _no_quota("deploy", (Phase(all_status(503, "1"), 1.0), Phase(healthy())), 3.0),
            _quota("fixed", (Phase(fixed_window(10, 1.0)),), 5.0, 10, 1.0),
        ]
    return [
        _no_quota("sporadic", (Phase(every_nth(25, 429, "1", times=4), 5.0), Phase(healthy())), 20.0),
        _no_quota("deploy", (Phase(all_status(503, "2"), 3.0), Phase(healthy())), 18.0),
        _no_quota("storm", (Phase(storm(), 5.0), Phase(healthy())), 20.0),
        _no_quota("storm-ra0", (Phase(storm("0"), 5.0), Phase(healthy())), 20.0),
        _no_quota("alternating", (Phase(every_nth(2, 429, "1"), 6.0), Phase(healthy())), 21.0),
        _quota("rising", (Phase(fixed_window(20, 2.0), 8.0), Phase(fixed_window(80, 2.0))), 26.0, 80, 2.0),
        _quota("falling", (Phase(fixed_window(80, 2.0), 8.0), Phase(fixed_window(20, 2.0))), 26.0, 20, 2.0),
        _quota("fixed", (Phase(fixed_window(50, 5.0)),), 30.0, 50, 5.0),
        _quota("sliding", (Phase(sliding_window(50, 5.0)),), 30.0, 50, 5.0),
        _quota("fixed-ietf", (Phase(fixed_window(50, 5.0, announce="ietf")),), 30.0, 50, 5.0),
    ]


# -- one run ----------------------------------------------------------------------------------


def make_session(fleet: str, scenario: Scenario, store: MemoryCooldownStore | None) -> requests.Session:
    """A worker's Session for ``fleet`` (the adapters of a run share ``store``)."""
    session = requests.Session()
    adapter: HTTPAdapter
    if fleet == "stock":
        retry = Retry(
            total=TOTAL, backoff_factor=BACKOFF, status_forcelist=STATUSES, respect_retry_after_header=True
        )
        adapter = HTTPAdapter(max_retries=retry)
    else:
        policy = RetryAfterRetry(
            total=TOTAL,
            backoff_factor=BACKOFF,
            status_forcelist=STATUSES,
            deadline=DEADLINE,
            attempt_reserve=ATTEMPT_RESERVE,
        )
        keywords = {"max_concurrency": MAX_CONCURRENCY} if fleet == "defaults" else scenario.best
        adapter = RetryAfterAdapter(max_retries=policy, cooldown=store, **keywords)
    session.mount("http://", adapter)
    return session


def numeric_fields(record: Any) -> dict[str, float]:
    """The numeric fields of a learned-rate record, whatever its type (a named tuple, a
    dataclass or a plain object), by name."""
    if hasattr(record, "_fields"):
        names = list(record._fields)
    elif dataclasses.is_dataclass(record):
        names = [f.name for f in dataclasses.fields(record)]
    else:
        names = [n for n in vars(record) if not n.startswith("_")] if hasattr(record, "__dict__") else []
    out: dict[str, float] = {}
    for name in names:
        value = getattr(record, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def rate_per_second(fields: dict[str, float]) -> float | None:
    """The learned rate as requests per second (``limit`` / ``window``), or None."""
    limit, window = fields.get("limit"), fields.get("window")
    if limit is None or window is None or limit <= 0 or window <= 0:
        return None
    return limit / window


class RateSampler:
    """Reads ``store.rate_of(scope)`` every :data:`SAMPLE_EVERY` seconds in a thread and
    keeps each change: ``{"t": seconds since start_at, **numeric fields}`` (only ``t``
    while the store has no record)."""

    def __init__(self, store: Any, scope: str, start_at: float) -> None:
        self.store, self.scope, self.start_at = store, scope, start_at
        self.changes: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last: dict[str, float] | None = None
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                record = self.store.rate_of(self.scope)
            except Exception:
                continue
            fields = numeric_fields(record) if record is not None else {}
            if fields != last:
                last = fields
                self.changes.append({"t": round(time.monotonic() - self.start_at, 2), **fields})

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join(2)
        return self.changes


def scope_of(url: str) -> str:
    """The adapter's default scope (the origin) of ``url``."""
    from retry_after_adapter.scope import RequestInfo, origin_scope

    return origin_scope(RequestInfo("GET", url, {}))


def work(session: requests.Session, url: str, end: float, calls: list[dict[str, Any]]) -> None:
    """One worker: GET until ``end`` (monotonic); a deferred call sleeps until its
    ``eligible_at`` (never past ``end``). Each call is kept in ``calls``."""
    while (start := time.monotonic()) < end:
        deferral = None
        outcome = "ok"
        try:
            response = session.get(url, timeout=10)
            response.close()
            deferral = deferral_of(response)
            if getattr(response, "local", False):
                outcome = "local"
            elif deferral is not None:
                outcome = "deferred"
            elif response.status_code >= 300:
                outcome = str(response.status_code)
        except RetryDeferred as exc:
            deferral, outcome = exc.deferral, "deferred"
        except requests.RequestException as exc:
            outcome = type(exc).__name__
        calls.append({"start": start, "end": time.monotonic(), "outcome": outcome})
        if deferral is not None:
            wait = (deferral.eligible_at - datetime.now(timezone.utc)).total_seconds()
            time.sleep(max(0.0, min(wait, end - time.monotonic())))


def warm_up() -> None:
    """One GET through each fleet's kind of Session against a throwaway server, so that
    the first run does not pay the first request's imports and set-up."""
    scenario = _no_quota("warm-up", (Phase(healthy()),), 1.0)
    with ScenarioServer(scenario.phases) as server:
        for fleet in FLEETS:
            with make_session(fleet, scenario, MemoryCooldownStore()) as session:
                session.get(server.url + "/warm-up", timeout=10).close()


def run(scenario: Scenario, fleet: str, threads: int, latency: float) -> dict[str, Any]:
    """One fleet through one scenario on a fresh server: what the server saw (arrivals,
    announcements), what the workers did, when the store learned of cooldowns and the
    learned rate over time. The adapters' store is a ``MemoryCooldownStore`` that also
    stamps when it was read (``X-Checked-At``) and written (``lib.fleet.make_store``)."""
    store = _fleet.make_store(None) if fleet != "stock" else None
    _fleet.STORE_WRITES.clear()
    sessions = [make_session(fleet, scenario, store) for _ in range(threads)]
    calls: list[dict[str, Any]] = []
    with ScenarioServer(scenario.phases, latency=latency) as server:
        assert server.t0 is not None
        end = server.t0 + scenario.seconds
        sampler = RateSampler(store, scope_of(server.url), server.t0) if store is not None else None
        workers = [
            threading.Thread(target=work, args=(s, server.url + "/items", end, calls), daemon=True)
            for s in sessions
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(max(0.0, end - time.monotonic()) + 60)
        changes = sampler.stop() if sampler is not None else []
    for session in sessions:
        session.close()
    writes = sorted(_fleet.STORE_WRITES)
    return {"server": server, "calls": calls, "rate_changes": changes, "store_writes": writes}


# -- the figures ------------------------------------------------------------------------------


def phase_starts(scenario: Scenario) -> list[float]:
    """When each phase begins, in seconds since the start."""
    starts = [0.0]
    for phase in scenario.phases[:-1]:
        starts.append(starts[-1] + (phase.seconds or 0.0))
    return starts


def measured_from(scenario: Scenario, settle: float) -> float:
    """Seconds since the start from which goodput is measured: the transient's end (the
    last phase's start) plus max(``settle``, 3 windows of the last phase)."""
    return phase_starts(scenario)[-1] + max(settle, 3 * scenario.window())


def early_after_store_knew(server: ScenarioServer, writes: Sequence[float]) -> int | None:
    """Early requests admitted after the store had learned of the cooldown they were
    sent in: a store write after the first 429 (or 503) announcing it was sent, and
    before the request's admission read the store (``checked_at``). The rest of the
    early requests were admitted before the store knew (the answer was on its way, or
    just being written). None without store stamps (stock reads no store)."""
    seen = server.seen()
    if not any(a.checked_at is not None for a in seen):
        return None
    known = 0
    for a in seen:
        if not a.early or a.checked_at is None:
            continue
        sent = a.sent_at if a.sent_at is not None else a.at
        first = min(x.at for x in server.announcements if x.at + server.in_flight <= sent < x.until)
        k = bisect.bisect_left(writes, first)
        known += k < len(writes) and writes[k] < a.checked_at
    return known


def per_second(server: ScenarioServer, seconds: float) -> list[int]:
    """2xx answers in each whole second of the run."""
    counts = [0] * math.ceil(seconds)
    for a in server.seen():
        if 200 <= a.status < 300 and 0 <= a.t < seconds:
            counts[int(a.t)] += 1
    return counts


def describe_rate(fields: dict[str, float] | None) -> str:
    """A learned-rate record in a few words: ``L/W s``, ``cap N`` while cold, ``open``."""
    fields = {k: v for k, v in (fields or {}).items() if k != "t"}
    if not fields:
        return "-"
    rate = rate_per_second(fields)
    if rate is not None:
        return f"{fields['limit']:g}/{fields['window']:.2f} s"
    cap = fields.get("cap")
    return f"cap {cap:g}" if cap else "open"


def summarise(scenario: Scenario, fleet: str, result: dict[str, Any], begin: float) -> dict[str, Any]:
    server: ScenarioServer = result["server"]
    seen = server.seen()
    rate = server.goodput(begin, scenario.seconds)
    calls = result["calls"]
    outcomes: dict[str, int] = {}
    for c in calls:
        outcomes[c["outcome"]] = outcomes.get(c["outcome"], 0) + 1
    changes = result["rate_changes"]
    return {
        "fleet": fleet,
        "measured_from_s": begin,
        "config": scenario.best_label if fleet == "best" else fleet,
        "goodput_per_s": rate.per_second,
        "allowed_per_s_by_script": rate.allowed_per_second,
        "requests": len(seen),
        "2xx": sum(1 for a in seen if 200 <= a.status < 300),
        "429": sum(1 for a in seen if a.status == 429),
        "5xx": sum(1 for a in seen if a.status >= 500),
        "early": server.early(),
        "early_after_store_knew": early_after_store_knew(server, result["store_writes"]),
        "overruns": server.overruns(),
        "good_per_second": per_second(server, scenario.seconds),
        "calls": len(calls),
        "outcomes": outcomes,
        "worst_call_s": max((c["end"] - c["start"] for c in calls), default=0.0),
        "rate_changes": changes,
        "learned_at_end": describe_rate(changes[-1] if changes else None),
    }


# -- the pictures -----------------------------------------------------------------------------

COLOURS = {"2xx": "#2ca02c", "429": "#ff7f0e", "5xx": "#d62728", "other": "#7f7f7f"}
COOLDOWN = "#6baed6"
RATE = "#1f4e9c"
QUOTA = "#000000"
#: The picture's geometry in pixels: width, margins, a lane's height and the gap under it.
WIDTH, LEFT, RIGHT, LANE, GAP, TOP = 1100, 70, 70, 150, 62, 92


def _buckets(server: ScenarioServer, seconds: float) -> list[dict[str, int]]:
    """Arrivals per :data:`BUCKET` seconds, by status class."""
    out = [dict.fromkeys(COLOURS, 0) for _ in range(math.ceil(seconds / BUCKET))]
    for a in server.seen():
        if 0 <= a.t < seconds:
            kind = "2xx" if 200 <= a.status < 300 else "429" if a.status == 429 else "5xx"
            out[min(int(a.t / BUCKET), len(out) - 1)][kind if a.status < 600 else "other"] += 1
    return out


def _merged(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping spans as one."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _step(span: float, most: int) -> float:
    """A round tick step that puts at most ``most`` ticks on ``span``."""
    for step in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        if span / step <= most:
            return step
    return 10000.0


def _axis(top: float, scale: float, step: float, x: float, side: int) -> list[str]:
    """Ticks and labels of a vertical axis at ``x`` (``side`` -1: left, 1: right) from 0
    to ``scale`` (at ``top``), one per ``step``."""
    out, v = [], 0.0
    anchor = "end" if side < 0 else "start"
    while v <= scale + 1e-9:
        y = top + LANE - LANE * v / scale
        out.append(f'<line x1="{x}" y1="{y:.1f}" x2="{x + 4 * side}" y2="{y:.1f}" stroke="#333"/>')
        out.append(f'<text x="{x + 6 * side}" y="{y + 4:.1f}" text-anchor="{anchor}">{v:g}</text>')
        v += step
    return out


def _lane(
    scenario: Scenario, name: str, result: dict[str, Any], summary: dict[str, Any], top: float
) -> list[str]:
    """One fleet's lane: bars of arrivals per bucket by status (left axis), cooldowns
    announced as shaded spans, the quota and the learned rate as requests per second
    (right axis), the phases' changes, a seconds axis and the bracket of the goodput's
    interval."""
    seconds, plot_w, base = scenario.seconds, WIDTH - LEFT - RIGHT, top + LANE
    server: ScenarioServer = result["server"]

    def x(t: float) -> float:
        return LEFT + plot_w * min(max(t, 0.0), seconds) / seconds

    starts = phase_starts(scenario)
    buckets = _buckets(server, seconds)
    bars_step = _step(max([sum(b.values()) for b in buckets] + [1]), 4)
    bars_max = math.ceil(max([sum(b.values()) for b in buckets] + [1]) * 1.05 / bars_step) * bars_step
    rates = [(c["t"], rate_per_second(c)) for c in result["rate_changes"]]
    quotas = []
    for index, phase in enumerate(scenario.phases):
        limit, window = getattr(phase.behaviour, "limit", None), getattr(phase.behaviour, "window", None)
        if limit and window:
            quotas.append(
                (starts[index], starts[index + 1] if index + 1 < len(starts) else seconds, limit / window)
            )
    tallest = max([r for _, r in rates if r] + [q for _, _, q in quotas] + [1.0])
    rate_step = _step(tallest, 4)
    rate_max = math.ceil(tallest * 1.1 / rate_step) * rate_step

    def y_rate(v: float) -> float:
        return base - LANE * min(v, rate_max) / rate_max

    ratio = summary.get("ratio")
    title = (
        f"{name}{' (' + summary['config'] + ')' if name == 'best' else ''}: goodput "
        f"{summary['goodput_per_s']:.1f}/s"
        + (f" ({ratio:.2f} of allowed)" if ratio is not None else "")
        + f", 429s {summary['429']}, 5xx {summary['5xx']}, early {summary['early']}, "
        f"overruns {summary['overruns']}"
        + (f", learned at end {summary['learned_at_end']}" if name != "stock" else "")
    )
    out = [
        f'<text x="{LEFT}" y="{top - 8}" font-size="12" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{LANE}" fill="#fafafa" stroke="#999"/>',
    ]
    for lo, hi in _merged([(a.t, a.t_until) for a in server.announcements]):
        if lo < seconds:
            out.append(
                f'<rect x="{x(lo):.1f}" y="{top}" width="{max(x(hi) - x(lo), 0.5):.1f}" height="{LANE}" '
                f'fill="{COOLDOWN}" fill-opacity="0.3"/>'
            )
    for t in starts[1:]:
        out.append(
            f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{base}" stroke="#555" '
            'stroke-dasharray="2,2"/>'
        )
    bar_w = plot_w * BUCKET / seconds
    for k, bucket in enumerate(buckets):
        below = 0
        for kind, colour in COLOURS.items():
            if bucket[kind]:
                y_top = base - LANE * (below + bucket[kind]) / bars_max
                out.append(
                    f'<rect x="{LEFT + k * bar_w:.1f}" y="{y_top:.1f}" width="{max(bar_w - 0.4, 0.5):.2f}" '
                    f'height="{LANE * bucket[kind] / bars_max:.1f}" fill="{colour}"/>'
                )
                below += bucket[kind]
    for lo, hi, q in quotas:
        out.append(
            f'<line x1="{x(lo):.1f}" y1="{y_rate(q):.1f}" x2="{x(hi):.1f}" y2="{y_rate(q):.1f}" '
            f'stroke="{QUOTA}" stroke-width="1.5" stroke-dasharray="5,3"/>'
        )
    path = []
    for i, (t, r) in enumerate(rates):
        if r is None or t >= seconds:
            continue
        following = rates[i + 1] if i + 1 < len(rates) else (seconds, None)
        path.append(f"M{x(t):.1f},{y_rate(r):.1f} H{x(following[0]):.1f}")
        if following[1] is not None:
            path.append(f"V{y_rate(following[1]):.1f}")
    if path:
        out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{RATE}" stroke-width="2"/>')
    out += _axis(top, bars_max, bars_step, LEFT, -1)
    middle = top + LANE / 2
    out.append(
        f'<text transform="translate({LEFT - 44},{middle}) rotate(-90)" text-anchor="middle">'
        f"bars: per {BUCKET * 1000:g} ms</text>"
    )
    if path or quotas:  # a lane without lines has no right axis
        out += _axis(top, rate_max, rate_step, LEFT + plot_w, 1)
        out.append(
            f'<text transform="translate({LEFT + plot_w + 50},{middle}) rotate(90)" text-anchor="middle">'
            "lines: per second</text>"
        )
    t, x_step = 0.0, _step(seconds, 16)
    while t <= seconds + 1e-9:
        out.append(f'<line x1="{x(t):.1f}" y1="{base}" x2="{x(t):.1f}" y2="{base + 4}" stroke="#333"/>')
        out.append(f'<text x="{x(t):.1f}" y="{base + 15}" text-anchor="middle">{t:g}</text>')
        t += x_step
    begin = summary["measured_from_s"]
    out.append(f'<path d="M{x(begin):.1f},{base + 22} v4 H{x(seconds):.1f} v-4" fill="none" stroke="#333"/>')
    out.append(
        f'<text x="{LEFT + plot_w}" y="{base + 38}" text-anchor="end">seconds since the script started</text>'
    )
    return out


def svg(scenario: Scenario, lanes: Sequence[tuple[str, dict[str, Any], dict[str, Any]]]) -> str:
    """The scenario as one SVG picture: a title, a legend and a lane per ``(fleet, run,
    summary)``."""
    height = TOP + len(lanes) * (LANE + GAP) + 20
    begin = lanes[0][2]["measured_from_s"]
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="15" font-weight="bold">scenario {escape(scenario.name)}: '
        + escape("; then ".join(p.behaviour.describe() for p in scenario.phases))
        + "</text>",
    ]
    legend = [
        ("rect", COLOURS["2xx"], "2xx"),
        ("rect", COLOURS["429"], "429"),
        ("rect", COLOURS["5xx"], "5xx"),
        ("span", COOLDOWN, "cooldown announced (Retry-After)"),
        ("line", RATE, "learned rate (limit / window)"),
        ("dash", QUOTA, "the script's quota"),
        ("dots", "#555", "next phase"),
    ]
    lx = float(LEFT)
    for kind, colour, label in legend:
        if kind in ("rect", "span"):
            opacity = ' fill-opacity="0.3"' if kind == "span" else ""
            head.append(f'<rect x="{lx:.0f}" y="32" width="14" height="10" fill="{colour}"{opacity}/>')
        else:
            dash = {"dash": ' stroke-dasharray="5,3"', "dots": ' stroke-dasharray="2,2"'}.get(kind, "")
            head.append(
                f'<line x1="{lx:.0f}" y1="37" x2="{lx + 14:.0f}" y2="37" stroke="{colour}" '
                f'stroke-width="2"{dash}/>'
            )
        head.append(f'<text x="{lx + 18:.0f}" y="41">{escape(label)}</text>')
        lx += 26 + 6.2 * len(label)
    head.append(
        f'<text x="{LEFT}" y="62" fill="#444">bars: requests arriving per {BUCKET * 1000:g} ms (left axis); '
        f"lines: requests per second (right axis); goodput measured from {begin:g} s to "
        f"{scenario.seconds:g} s (the bracket under each lane)</text>"
    )
    body = [line for n, lane in enumerate(lanes) for line in _lane(scenario, *lane, TOP + n * (LANE + GAP))]
    return "\n".join([*head, *body, "</svg>"]) + "\n"


# -- the report -------------------------------------------------------------------------------


def early_cell(summary: dict[str, Any]) -> str:
    """``early (after the store knew)``, or ``early`` alone for stock."""
    known = summary["early_after_store_knew"]
    return str(summary["early"]) + (f" ({known})" if known is not None else "")


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--threads", type=int, help="worker threads per fleet (default 32; quick 8)")
    p.add_argument("--only", default="", help="comma-separated scenario names to run (default all)")
    p.add_argument(
        "--latency", type=float, default=0.0, help="seconds the server waits before each answer (default 0)"
    )
    args = p.parse_args()
    threads = args.threads or (8 if args.quick else 32)
    settle = 1.0 if args.quick else 5.0
    chosen = scenarios(args.quick)
    wanted = [w for w in args.only.split(",") if w]
    if wanted:
        unknown = set(wanted) - {s.name for s in chosen}
        if unknown:
            p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        chosen = [s for s in chosen if s.name in wanted]
    _fleet.install_send_stamp()
    warm_up()
    load_at_start = _common.loadavg()
    began = time.monotonic()

    report: dict[str, Any] = {}
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in chosen:
        begin = measured_from(scenario, settle)
        lanes = []
        runs: dict[str, dict[str, Any]] = {}
        for fleet in FLEETS:
            result = run(scenario, fleet, threads, args.latency)
            summary = summarise(scenario, fleet, result, begin)
            runs[fleet] = summary
            lanes.append((fleet, result, summary))
        stock = runs["stock"]["goodput_per_s"]
        # Where the server has no quota, what it allowed is what the best configuration
        # got in the same run: the same fleet (8 connections) without the learned rate.
        # Stock, 32 connections, is shown beside it.
        best = runs["best"]["goodput_per_s"]
        for summary in runs.values():
            by_script = summary["allowed_per_s_by_script"]
            allowed = by_script if by_script is not None else best
            summary["stock_goodput_per_s"] = stock
            summary["allowed_per_s"] = allowed
            summary["allowed_from"] = "script" if by_script is not None else "best run"
            summary["ratio"] = summary["goodput_per_s"] / allowed if allowed else None
            rows.append(
                [
                    scenario.name,
                    summary["config"],
                    f"{summary['goodput_per_s']:.1f}",
                    f"{stock:.1f}",
                    f"{allowed:.1f}" + ("" if by_script is not None else " (best)"),
                    _common.fmt(summary["ratio"], 2),
                    f"{summary['429']} / {summary['5xx']}",
                    early_cell(summary),
                    summary["overruns"],
                    summary["learned_at_end"] if summary["fleet"] != "stock" else "-",
                    " ".join(str(n) for n in summary["good_per_second"]),
                ]
            )
            print(
                f"{scenario.name} {summary['config']}: goodput {summary['goodput_per_s']:.1f}/s "
                f"(ratio {_common.fmt(summary['ratio'], 2)}), 429s {summary['429']}, 5xx {summary['5xx']}, "
                f"early {summary['early']}, overruns {summary['overruns']}",
                flush=True,
            )
        picture = args.out / f"scenario-{scenario.name}.svg"
        picture.write_text(svg(scenario, lanes), encoding="utf-8")
        report[scenario.name] = {
            "phases": [
                {"seconds": ph.seconds, "behaviour": ph.behaviour.describe()} for ph in scenario.phases
            ],
            "seconds": scenario.seconds,
            "measured_from_s": begin,
            "best": scenario.best_label,
            "svg": str(picture),
            "fleets": runs,
        }
    took = time.monotonic() - began
    tables = [
        _common.table(
            f"Scripted scenarios, {threads} threads per fleet; goodput = 2xx per second from the "
            f"transient's end + max({settle:g} s, 3 windows) to the end; allowed: the quota's rate, or "
            "where the server has none the best configuration's goodput in the same run",
            [
                "scenario",
                "fleet",
                "goodput /s",
                "stock /s",
                "allowed /s",
                "ratio",
                "429s / 5xx",
                "early (after the store knew)",
                "overruns",
                "learned at end",
                "2xx per second",
            ],
            rows,
        ),
        f"(pictures: {', '.join(str(args.out / f'scenario-{s.name}.svg') for s in chosen)}; {took:.0f} s)\n",
    ]
    payload = {
        "settings": {
            "threads": threads,
            "quick": args.quick,
            "settle_s": settle,
            "latency_s": args.latency,
            "retry_total": TOTAL,
            "backoff_factor": BACKOFF,
            "deadline_s": DEADLINE,
            "attempt_reserve_s": ATTEMPT_RESERVE,
            "max_concurrency_defaults": MAX_CONCURRENCY,
            "took_s": round(took, 1),
        },
        "loadavg_at_start": load_at_start,
        "scenarios": report,
    }
    _common.finish("scenarios", payload, tables, args.out)


if __name__ == "__main__":
    main()
