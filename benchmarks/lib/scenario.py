"""The scripted-scenario benchmark's machinery (``bench_scenarios.py``): a scenario
(phases of server behaviour and the best fleet's keywords), the sampler that follows the
learned rate while a fleet runs, and the SVG picture of a scenario's runs.

A script of phases is ``retry_after_adapter.testing.scenarios``' ``ScenarioServer``; this
module only describes, samples and draws.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from retry_after_adapter.testing.scenarios import Phase, ScenarioServer

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


def phase_starts(scenario: Scenario) -> list[float]:
    """When each phase begins, in seconds since the start."""
    starts = [0.0]
    for phase in scenario.phases[:-1]:
        starts.append(starts[-1] + (phase.seconds or 0.0))
    return starts


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


# -- the picture -----------------------------------------------------------------------------

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
