"""`python -m agent` runs the burstwatch command line."""

import sys

from agent.cli import main

sys.exit(main())
