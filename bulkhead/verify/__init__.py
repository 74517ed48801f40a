"""Exhaustive model checker over the transfer protocol's own transition
functions (bulkhead.protocol), the legacy variant that reproduces the
incident, and the guard ablations. Entry point: bulkhead.verify.cli."""
