"""What an engine says about a request: the protocol's own output type (it
crosses the process boundary in the `Output` message), importable from here."""

from bulkhead.protocol.outputs import RequestOutput, TokenLogprobs

__all__ = ["RequestOutput", "TokenLogprobs"]
