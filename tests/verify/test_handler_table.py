"""The handler table (bulkhead/verify/handlers.py) is the runtime's:
every handler it names exists, calls exactly the transition functions it
lists, and every message a dispatch table takes is in it. Without this the
coverage `bulkhead verify` reports could describe a runtime that is not
the one that runs."""
import inspect
import re

import pytest

from bulkhead.disagg import messages as m
from bulkhead.disagg.decode_worker import DecodeWorker
from bulkhead.disagg.prefill_worker import PrefillWorker
from bulkhead.disagg.router import DisaggBackend
from bulkhead.protocol.transitions import REGISTRY
from bulkhead.verify.handlers import HANDLERS

RUNTIME = {"router": DisaggBackend, "prefill": PrefillWorker, "decode": DecodeWorker}
CALL = re.compile(r"\b(router|prefill|decode)_job\.(\w+)\(")


def _called(cls, methods) -> set[str]:
    source = "".join(inspect.getsource(getattr(cls, name)) for name in methods)
    return {f"{actor}.{fn}" for actor, fn in CALL.findall(source)}


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda h: f"{h.actor}:{h.on}")
def test_each_handler_calls_exactly_the_transitions_it_lists(handler):
    cls = RUNTIME[handler.actor]
    for name in handler.methods:
        assert hasattr(cls, name), f"{cls.__name__} has no {name}"
    assert _called(cls, handler.methods) == set(handler.transitions)
    assert handler.transitions or handler.why_none, "a handler without transitions says what it does"


@pytest.mark.parametrize("actor", sorted(RUNTIME))
def test_every_method_that_calls_a_transition_is_part_of_a_listed_handler(actor):
    cls = RUNTIME[actor]
    listed = {name for h in HANDLERS if h.actor == actor for name in h.methods}
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if CALL.search(inspect.getsource(member)):
            assert name in listed, f"{cls.__name__}.{name} takes transitions but no handler lists it"


def _dispatch_kinds(actor) -> set[str]:
    cls = RUNTIME[actor]
    if actor == "router":
        table = DisaggBackend._handlers | {m.Register: None}
    else:
        table = cls.handlers(object.__new__(cls))  # bound methods only: no state is read
    return {message.kind for message in table}


@pytest.mark.parametrize("actor", sorted(RUNTIME))
def test_every_message_a_dispatch_table_takes_is_a_listed_handler(actor):
    assert _dispatch_kinds(actor) <= {h.on for h in HANDLERS if h.actor == actor}


def test_every_transition_function_is_called_by_some_handler():
    used = {name for h in HANDLERS for name in h.transitions}
    assert used == set(REGISTRY)
