"""The composition root: `bulkhead serve` wires the server, disagg and the
engine together here, and nowhere else.

Every other package is a component that imports only the packages below it
(tests/test_layout.py draws the order); this one sits above them all and
only `bulkhead.cli` imports it. A role picks the wiring:

    colocated        engine + HTTP server in one process      colocated.py
    router / local   HTTP server over a disaggregated cluster  disaggregated.py
                     (local: spawns its prefill and decode workers)
    prefill/decode   one worker process                        serve.py -> disagg.launch

    serve.py         the entry: logging, refusals, the HTTP server, the role's wiring
    engine_flags.py  the `serve` flags as an EngineConfig
    refusals.py      what stops a start before anything binds (keys, loopback, lineage key)
"""
