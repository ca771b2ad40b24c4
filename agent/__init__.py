"""burstwatch: EC2 network burst-credit estimation, ENA/MTU checks and peer probes."""

# The one place the version lives: pyproject.toml, the .deb and the .rpm read it from here.
__version__ = "0.1.0"
