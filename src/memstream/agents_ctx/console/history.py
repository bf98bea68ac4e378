"""The overview's live figures: a ring of lag samples over the last minutes, and events/s
derived from how far the end offsets of each topic moved between samples. Pure: the
sampler (``routes``) feeds it :class:`~memstream.agents_ctx.console.ports.LagPoint` rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from memstream.agents_ctx.console.ports import LagPoint

WINDOW_S = 600.0  # the chart shows the last ten minutes


@dataclass(frozen=True, slots=True)
class Sample:
    ts: float
    rows: tuple[LagPoint, ...]


@dataclass
class LagHistory:
    window_s: float = WINDOW_S
    samples: deque[Sample] = field(default_factory=deque)

    def add(self, ts: float, rows: Sequence[LagPoint]) -> None:
        self.samples.append(Sample(ts, tuple(rows)))
        while self.samples and self.samples[0].ts < ts - self.window_s:
            self.samples.popleft()

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def series(self) -> dict[str, object]:
        """uPlot data: ``{"ts": [...], "series": {"processor p0": [lag, ...], ...}}``."""
        names: list[str] = []
        for s in self.samples:
            for r in s.rows:
                n = f"{r.processor} p{r.partition}"
                if n not in names:
                    names.append(n)
        out: dict[str, list[int | None]] = {n: [] for n in names}
        for s in self.samples:
            have = {f"{r.processor} p{r.partition}": r.lag for r in s.rows}
            for n in names:
                out[n].append(have.get(n))
        return {"ts": [round(s.ts, 3) for s in self.samples], "series": out}

    def events_per_s(self) -> dict[str, float]:
        """Per topic: growth of the summed end offsets over the last two samples, per second."""
        if len(self.samples) < 2:
            return {}
        a, b = self.samples[-2], self.samples[-1]
        dt = b.ts - a.ts
        if dt <= 0:
            return {}

        def ends(s: Sample) -> dict[str, int]:
            seen: dict[tuple[str, int], int] = {}
            for r in s.rows:
                seen[(r.topic, r.partition)] = r.end_offset
            tot: dict[str, int] = {}
            for (topic, _), end in seen.items():
                tot[topic] = tot.get(topic, 0) + end
            return tot

        ea, eb = ends(a), ends(b)
        return {t: round(max(0, eb[t] - ea.get(t, eb[t])) / dt, 1) for t in sorted(eb)}
