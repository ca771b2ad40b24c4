"""A views' families, sample after sample, as one timestamped OpenMetrics file for `promtool tsdb
create-blocks-from openmetrics` (docs/replay.md, "Backfill into Prometheus")."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import IO, Iterable, Optional

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

# OpenMetrics wants each series' points together and in time order, and each family once: every series is
# spooled to its own file while the replay streams, and the files are joined family by family at the end.
_TYPES = {"gauge": "gauge", "counter": "counter", "info": "info", "unknown": "unknown"}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class OpenMetricsFile:
    """Collects families at sample times, writes the file on close(). Values NaN and +Inf are written as
    OpenMetrics spells them (`NaN`, `+Inf`); timestamps are Unix seconds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._dir = tempfile.mkdtemp(prefix="burstwatch-om-", dir=os.path.dirname(os.path.abspath(path)) or None)
        self._families: dict[str, tuple[str, str, str]] = {}        # name -> (type, help, unit)
        self._series: dict[tuple[str, str], IO[str]] = {}           # (family, sample line head) -> spool
        self._order: dict[str, list[tuple[str, str]]] = {}
        self._last: dict[tuple[str, str], float] = {}

    def add(self, timestamp: float, families: Iterable[Metric]) -> None:
        stamp = repr(round(timestamp, 3))
        for fam in families:
            if fam.name not in self._families:
                self._families[fam.name] = (_TYPES.get(fam.type, "unknown"), fam.documentation, fam.unit)
                self._order[fam.name] = []
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue        # no creation times: a replay's counters start with it
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                head = f"{s.name}{{{labels}}}" if labels else s.name
                key = (fam.name, head)
                spool = self._series.get(key)
                if spool is None:
                    spool = self._series[key] = open(os.path.join(self._dir, str(len(self._series))), "w+",
                                                      encoding="utf-8")
                    self._order[fam.name].append(key)
                if self._last.get(key, -1.0) >= timestamp:
                    continue        # OpenMetrics: one point per series per timestamp, increasing
                self._last[key] = timestamp
                spool.write(f"{head} {floatToGoString(s.value)} {stamp}\n")

    def close(self) -> None:
        """Join the spools into the file (ends with `# EOF`) and drop them."""
        try:
            with open(self.path, "w", encoding="utf-8") as out:
                for name, (kind, doc, unit) in self._families.items():
                    if not self._order[name]:
                        continue
                    out.write(f"# TYPE {name} {kind}\n")
                    if unit:
                        out.write(f"# UNIT {name} {unit}\n")
                    out.write(f"# HELP {name} {_escape(doc)}\n")
                    for key in self._order[name]:
                        spool = self._series[key]
                        spool.flush()
                        spool.seek(0)
                        shutil.copyfileobj(spool, out, 1 << 20)
                out.write("# EOF\n")
        finally:
            self.discard()

    def discard(self) -> None:
        for spool in self._series.values():
            spool.close()
        self._series.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


def optional(path: Optional[str]) -> Optional[OpenMetricsFile]:
    return OpenMetricsFile(path) if path else None
