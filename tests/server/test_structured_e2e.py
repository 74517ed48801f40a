"""Structured outputs and tool calls, colocated: the real server and model, the openai client."""
import pytest

from tests import structured_cases

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("case", structured_cases.ALL, ids=lambda f: f.__name__)
def test_structured(client, case):
    case(client)
