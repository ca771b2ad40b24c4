"""The figure table: every family on /metrics declared once, with its CloudWatch and `burstwatch status` forms.

Each entry is one `Figure` (schema.py): its Prometheus name (as exposed: counters end in `_total`, info
families in `_info`), type, help text and label names, the meaning docs/metrics.md prints, and, for the
figures read per direction from a sample, how the value is read from the `Snapshot`. Where a figure is
published to CloudWatch, its `CloudWatchForm` says under which name, unit, statistic and dimensions, and how
the value is read; where `burstwatch status` shows it per direction, its `StatusForm` names the field. The
Prometheus views (agent/exporters/), the CloudWatch publisher, `burstwatch status` and docs/metrics.md
(scripts/gen_metrics_doc.py) all read these entries; none spells a name, a help text or a label again.

The entries live in one module per section of docs/metrics.md (credits.py, probes.py, ...), in the order
their view yields them; this module is the table's one door: `from agent.models import figures as F`, then
`F.CREDIT_REMAINING_BYTES`. Adding a figure: one entry in its section (and in its view's `declared(...)`)
plus its computation in a model."""

from __future__ import annotations

from typing import Sequence

from agent.models.figures import (
    allowances,
    cloudwatch,
    credits,
    ena,
    fleet,
    instance,
    probes,
    process,
    responder,
    sampling,
    state,
)
from agent.models.figures.allowances import *  # noqa: F403 (the table's one door; see the docstring)
from agent.models.figures.cloudwatch import *  # noqa: F403
from agent.models.figures.credits import *  # noqa: F403
from agent.models.figures.ena import *  # noqa: F403
from agent.models.figures.fleet import *  # noqa: F403
from agent.models.figures.instance import *  # noqa: F403
from agent.models.figures.probes import *  # noqa: F403
from agent.models.figures.process import *  # noqa: F403
from agent.models.figures.responder import *  # noqa: F403
from agent.models.figures.sampling import *  # noqa: F403
from agent.models.figures.schema import (  # noqa: F401 (part of the door)
    EXHAUSTION_CAP_SECONDS,
    NAMESPACE,
    ChecksReader,
    CloudWatchForm,
    DirectionReader,
    Figure,
    PeerReader,
    PerChecks,
    PerDirection,
    PerPeer,
    PerSample,
    ProbeResultLike,
    SampleReader,
    SnapshotLike,
    StatusForm,
    probe_bits_per_second,
)
from agent.models.figures.state import *  # noqa: F403

# The sections in the order docs/metrics.md lists them; each section's entries in definition order.
SECTIONS = (process, sampling, credits, instance, ena, allowances, cloudwatch, state, responder, probes, fleet)
FIGURES: tuple[Figure, ...] = tuple(v for m in SECTIONS for v in vars(m).values() if isinstance(v, Figure))
BY_NAME: dict[str, Figure] = {f.name: f for f in FIGURES}

# What can be published to CloudWatch, by CloudWatch name; DEFAULT_METRICS are published when [cloudwatch]
# is on, the others need [cloudwatch] include. The trend forecast is in the default set because the default
# exhaustion alarm reads it (the arithmetic is in docs/cloudwatch.md, "Cost").
CLOUDWATCH_METRICS: dict[str, CloudWatchForm] = {c.name: c for f in FIGURES for c in f.cloudwatch}
DEFAULT_METRICS: tuple[str, ...] = tuple(n for n, c in CLOUDWATCH_METRICS.items() if c.default)
# The fields of each direction in `burstwatch status --json`, with the figure each one reads.
STATUS_FIELDS: tuple[tuple[Figure, StatusForm], ...] = tuple((f, s) for f in FIGURES for s in f.status)


def selected_metrics(include: Sequence[str]) -> tuple[list[str], list[str]]:
    """(CloudWatch metrics to publish: the default set, then `include` in its order; unknown names)."""
    names = list(DEFAULT_METRICS)
    unknown = []
    for n in include:
        if n not in CLOUDWATCH_METRICS:
            unknown.append(n)
        elif n not in names:
            names.append(n)
    return names, unknown
