"""Prefill/decode disaggregation. `protocol` holds the transfer protocol as
pure transition functions shared by the runtime loops and the model checker
(bulkhead.verify)."""
