"""Models: pure computations over readings (no I/O): counters, credit buckets, verdicts."""
