"""The model checker's actors: the transfer protocol as pure step functions
`step(config, state, event) -> Step(state, send, notes)` over frozen
dataclasses, carrying out bulkhead.protocol's transition functions on the
model's ledger and network (docs/verification.md, "Shared, and the
checker's own")."""
