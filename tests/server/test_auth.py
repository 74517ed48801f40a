import os
import time

import pytest

from bulkhead.errors import AuthenticationFailed
from bulkhead.server.auth import KeyStore


def write_keys(path, keys):
    body = "[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in keys.items())
    path.write_text(body)


def test_keys_map_to_tenants(tmp_path):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha", "sk-b": "beta"})
    store = KeyStore(f)
    assert store.tenant_for("Bearer sk-a") == "alpha"
    assert store.tenant_for("bearer sk-b") == "beta"
    assert store.tenants == {"alpha", "beta"}


@pytest.mark.parametrize("header", [None, "", "sk-a", "Bearer ", "Bearer sk-wrong", "Basic sk-a"])
def test_missing_or_wrong_keys_are_refused(tmp_path, header):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha"})
    with pytest.raises(AuthenticationFailed):
        KeyStore(f).tenant_for(header)


def test_removing_a_key_from_the_file_revokes_it(tmp_path):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha", "sk-b": "beta"})
    store = KeyStore(f)
    assert store.tenant_for("Bearer sk-b") == "beta"
    write_keys(f, {"sk-a": "alpha"})
    os.utime(f, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    store._checked = 0.0  # skip the once-a-second stat throttle
    with pytest.raises(AuthenticationFailed):
        store.tenant_for("Bearer sk-b")


def test_env_keys():
    store = KeyStore(None, "sk-x=xray, sk-y=yankee")
    assert store.tenant_for("Bearer sk-y") == "yankee"
    with pytest.raises(ValueError):
        KeyStore(None, "no-equals-sign")


def test_malformed_key_file_is_refused(tmp_path):
    f = tmp_path / "keys.toml"
    f.write_text('[keys]\n"sk-a" = 3\n')
    with pytest.raises(ValueError, match="keys"):
        KeyStore(f)
