"""The [allowances] section of the configuration (docs/allowances.md): split from config.py by job (its size)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from agent.config_checks import Validator


def _opt(default: Any, doc: str, *, lo: Optional[float] = None, hi: Optional[float] = None,
         check: Optional[Validator] = None, restart: bool = False) -> Any:
    """A config key, with the metadata agent.config's own helper gives (config_loader reads it)."""
    return field(default=default, metadata={"doc": doc, "lo": lo, "hi": hi, "check": check, "restart": restart})


def _check_allowance_source(value: str) -> str | None:
    return None if value in ("ena", "nft") else f"{value!r} is not one of ena, nft"


@dataclass(frozen=True)
class AllowancesConfig:
    # EC2 defaults; the lab's values (tests/e2e/test_allowance_lab.py) and the reasons: docs/allowances.md.
    source: str = _opt("ena", "PPS and conntrack counters from: ena (ethtool statistics) or nft (a lab's nftables "
                       "limiters)", check=_check_allowance_source, restart=True)
    nft_table: str = _opt("inet bwlab", "for source = nft: FAMILY NAME of the table whose `limit rate over` and "
                          "`ct count over N` rules stand in for the ENA counters", restart=True)
    window: float = _opt(300.0, "seconds the conntrack trend forecast fits (lab: 3)", lo=0.5, hi=3600.0)
    horizon: float = _opt(600.0, "burstwatch_conntrack_running_out: full within this many seconds at the trend "
                          "(lab: 4) ...", lo=0.1, hi=86400.0)
    running_out_share: float = _opt(0.8, "... and at least this share of the table in use", lo=0.0, hi=1.0)
    near_ceiling_ratio: float = _opt(0.9, "burstwatch_pps_near_ceiling: packets per second at this share of the "
                                     "learned ceiling", lo=0.0, hi=10.0)
    flows_interval: float = _opt(10.0, "seconds between reads of this host's flows, O(sockets) (lab: 0.5); a "
                                 "conntrack overflow reads them at once", lo=0.1, hi=3600.0)
    learn: bool = _opt(True, "learn the conntrack size and the PPS ceiling (false: count only)")
    # As [credits] save_interval: a learned size or ceiling is saved at once, so this bounds only what a crash
    # loses of the largest level seen creeping up; the lab keeps the default.
    save_interval: float = _opt(5.0, "longest seconds between saves of allowances.json while the state changes "
                                "without learning; a learned size or ceiling is saved at once (lab: 5)",
                                lo=0.5, hi=3600.0)
