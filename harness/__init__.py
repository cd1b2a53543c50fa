"""blockfuzz harness: ops and traces, the differential session, invariants,
the Hypothesis state machine, fuzz / replay drivers and the CLI."""
