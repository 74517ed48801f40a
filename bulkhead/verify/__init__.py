"""Exhaustive model checker over the transfer protocol's own transition
functions (bulkhead.protocol), carried out by the checker's actors
(actors/), the legacy variant that reproduces the incident, and guards
each switchable off (tests/verify/test_guards.py). Entry point: bulkhead.verify.cli."""
