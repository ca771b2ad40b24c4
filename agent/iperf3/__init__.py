"""The iperf3-compatible probe engine: protocol, streams, sockets, client (`run_probe`) and JSON report."""
