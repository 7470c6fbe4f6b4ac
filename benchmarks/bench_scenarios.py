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
import math
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import requests
from lib import common as _common
from lib import fleet as _fleet
from lib.scenario import RateSampler, Scenario, phase_starts, rate_per_second, svg
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
        sampler = RateSampler(store, _common.scope_of(server.url), server.t0) if store is not None else None
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
