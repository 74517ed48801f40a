"""What an engine says about a request: the protocol's own output type.

RequestOutput and TokenLogprobs live in bulkhead.protocol.outputs because
they cross the process boundary as the payload of the `Output` message
(bulkhead.protocol.messages), and the model checker's decode sends the same
message; the engine, the HTTP layer and the router import them from here
or from there, one class either way.
"""

from bulkhead.protocol.outputs import RequestOutput, TokenLogprobs

__all__ = ["RequestOutput", "TokenLogprobs"]
