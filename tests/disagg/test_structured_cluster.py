"""Structured outputs and tool calls through router + prefill + decode: the
grammar travels in the signed ticket and decode rebuilds the mask over the
token prefill sampled, so every answer still parses."""
import pytest

from tests import structured_cases

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("case", structured_cases.ALL, ids=lambda f: f.__name__)
def test_structured(alpha, case):
    case(alpha)
