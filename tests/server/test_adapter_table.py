"""keys.toml's [tenants.NAME.adapters]: mistakes leave the entry out, closed."""

from pathlib import Path

from bulkhead.server.keys_file import parse_key_file

TEXT = """
[keys]
"sk-a" = "alpha"

[tenants.alpha]
weight = 2

[tenants.alpha.adapters]
sql = "/srv/sql"
rel = "adapters/chat"
base = "/srv/x"
"bad name" = "/srv/y"
empty = ""
"""


def test_adapters_parse_beside_the_tenants_limits_and_mistakes_fail_closed():
    parsed = parse_key_file(TEXT, "/etc/bulkhead/keys.toml", base_model_id="base")
    assert parsed.policies["alpha"].weight == 2
    assert parsed.adapters == {"alpha": {"sql": Path("/srv/sql"), "rel": Path("/etc/bulkhead/adapters/chat")}}
    problems = "\n".join(parsed.problems)
    assert "keys.toml:11: [tenants.alpha.adapters] base: the base model's name" in problems
    assert "'bad name'" in problems and "empty: must be a directory path" in problems


def test_an_adapter_table_of_a_tenant_no_key_names_serves_nobody():
    parsed = parse_key_file(TEXT + '\n[tenants.ghost.adapters]\nsql = "/srv/ghost"\n', "keys.toml")
    assert "ghost" not in parsed.adapters
    assert any("no API key names tenant 'ghost'" in p for p in parsed.problems)
