"""The resident daemon stays light: pyroute2 (~23 MB RSS) and boto3 (~29 MB) never load into it on the
default path; the checks run in a child process and the DescribeInstanceTypes refresh in a forked one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, free_port

SCRIPT = """
import sys
from agent import config
from agent.daemon import Daemon
cfg = config.parse('''
interfaces = ["lo"]
state_dir = "{state}"
[metrics]
listen = "127.0.0.1:{port}"
[imds]
enabled = false
[responder]
enabled = false
''')
d = Daemon(cfg, None)
a = d.setup()
a.sampler.step(); a.sampler.step()
checks = [s for s in a.services if s.name == "checks"][0]
state = checks.run_once(include_slow=False)
print(len(state.verdicts) > 0, "pyroute2" in sys.modules, "boto3" in sys.modules, "botocore" in sys.modules)
"""


def test_no_heavy_imports_in_the_resident_daemon(tmp_path: Path) -> None:
    code = SCRIPT.format(state=tmp_path, port=free_port())
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False", "False", "False"], out.stdout + out.stderr
