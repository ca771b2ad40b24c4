"""Build check contexts from the ethtool fixtures, for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from agent import config as configmod
from agent.checks.context import CheckContext, CounterSample, InstanceFacts
from agent.readers.ethtool import FixtureEthtoolReader
from agent.readers.links import LinkInfo, RouteInfo, RxCounters

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ethtool"
EMPTY_SYSFS = Path("/nonexistent/sysfs")   # fixtures have no sysfs: the driver comes from ethtool -i

# What the catalogue says about the types the fixtures come from (AWS DescribeInstanceTypes: VCpuInfo,
# EnaSupport, DefaultEnaQueueCountPerInterface, EnaSrdSupported).
FACTS = {
    "ena-1.5.0g-r4.large": InstanceFacts("r4.large", 2, "supported", 2, False, True, "catalogue"),
    "ena-intree-6.1-m5.large": InstanceFacts("m5.large", 2, "required", 2, False, True, "catalogue"),
    "ena-2.12.3g-m6i.xlarge": InstanceFacts("m6i.xlarge", 4, "required", 4, False, True, "catalogue"),
    "ena-2.12.3g-c6in.32xlarge-express": InstanceFacts("c6in.32xlarge", 128, "required", 32, True, True,
                                                       "catalogue"),
    "vif-xen-m4.large": InstanceFacts("m4.large", 2, "unsupported", None, False, True, "catalogue"),
    "ixgbevf-4.1.0-k-c4.large": InstanceFacts("c4.large", 2, "unsupported", None, False, True, "catalogue"),
    "veth-lab": InstanceFacts(None, 2, None, None, None, False, "none"),
}


def fixture_context(name: str, *, ifname: str = "eth0", mtu: int = 9001, routes: tuple[RouteInfo, ...] = (),
                    before: Optional[dict[str, CounterSample]] = None,
                    after: Optional[dict[str, CounterSample]] = None,
                    facts: Optional[InstanceFacts] = None, cfg: Optional[configmod.Config] = None,
                    **kw: Any) -> CheckContext:
    link = LinkInfo(ifname, 2, mtu, None, "UP", 9216, RxCounters())
    return CheckContext(config=cfg or configmod.Config(), interfaces=[ifname],
                        ethtool=FixtureEthtoolReader({ifname: FIXTURES / name}), links={ifname: link},
                        routes=list(routes), instance=facts or FACTS[name], before=before or {},
                        after=after or {}, sysfs=str(EMPTY_SYSFS), **kw)
