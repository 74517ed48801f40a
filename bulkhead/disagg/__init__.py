"""Prefill/decode disaggregation at run time: the router, the prefill and
decode workers, the links between them and the KV transfer backends. The
protocol they carry out is pure and lives beside them in bulkhead.protocol,
which the model checker (bulkhead.verify) explores."""
