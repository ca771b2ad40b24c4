"""The resident daemon stays light: pyroute2 (~23 MB RSS) and boto3 (~29 MB) never load into it on the
default path; the checks run in a child process and the DescribeInstanceTypes refresh in a forked one.
Smaller: the other subcommands' code, subprocess, ctypes and the whole instance-type table stay out too
(docs/architecture.md, "What stays out of the resident process")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, free_port

SCRIPT = """
import sys
import prometheus_client
before = set(sys.modules)            # what the exposition library loads itself (on 3.9, platform loads subprocess)
from agent import config
from agent.cli import build_parser
from agent.daemon import Daemon
from agent.models import catalogue
build_parser()
parsed = []                          # whole-table parses (the daemon reads its type's line only)
whole = catalogue.decode_catalogue
catalogue.decode_catalogue = lambda text: parsed.append(1) or whole(text)
cfg = config.parse('''
interfaces = ["lo"]
state_dir = "{state}"
[instance]
type = "r4.large"
[metrics]
listen = "127.0.0.1:{port}"
[imds]
enabled = false
[responder]
enabled = false
''')
d = Daemon(cfg, None)
a = d.setup()
a.sampler.sample(); a.sampler.sample()
checks = [s for s in a.services if s.name == "checks"][0]
state = checks.run_once(include_slow=False)
print(len(state.verdicts) > 0, "pyroute2" in sys.modules, "boto3" in sys.modules, "botocore" in sys.modules)
light = ["subprocess", "ctypes", "agent.commands.probe", "agent.cloudwatch.alarms", "agent.readers.ec2api"]
print(*[m for m in light if m in sys.modules and m not in before], len(parsed),
      (a.profile.peak_bytes_per_second or 0) > 0)
"""


def test_no_heavy_imports_in_the_resident_daemon(tmp_path: Path) -> None:
    code = SCRIPT.format(state=tmp_path, port=free_port())
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["True", "False", "False", "False"], out.stdout + out.stderr
    # no light module resident; the table never parsed, yet r4.large's figures found
    assert lines[1].split() == ["0", "True"], out.stdout + out.stderr
