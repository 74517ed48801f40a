import os
import time

import pytest

from bulkhead.errors import AuthenticationFailed, PermissionDenied
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


def later(path, seconds=2):
    t = time.time_ns() + seconds * 10**9
    os.utime(path, ns=(t, t))


def reload(store):
    store._checked = 0.0  # skip the once-a-second stat throttle
    store.maybe_reload()


def test_an_empty_keys_table_revokes_every_key_and_a_file_without_one_revokes_no_one(tmp_path):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha"})
    store = KeyStore(f)
    f.write_text("")  # an editor that truncated the file before writing it
    later(f)
    reload(store)
    assert store.tenant_for("Bearer sk-a") == "alpha" and store.stale
    assert "no [keys] table" in store.reload_error and store.reload_failures == 1
    f.write_text("[keys]\n")
    later(f, 4)
    reload(store)
    assert store.reload_error is None
    with pytest.raises(AuthenticationFailed):
        store.tenant_for("Bearer sk-a")


def test_a_bad_entry_is_named_with_its_line_logged_once_and_authorises_nothing(tmp_path, caplog):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha", "sk-b": "beta", "sk-c": "gamma"})
    store = KeyStore(f)
    f.write_text('[keys]\n"sk-a" = "alpha"\n"sk-b" = 3\n')  # sk-c removed, sk-b garbled
    later(f)
    with caplog.at_level("ERROR"):
        for _ in range(3):
            reload(store)
    assert "keys.toml:3: [keys] the tenant of a key must be a non-empty string, got 3" in store.reload_error
    assert caplog.text.count("keys file reloaded with mistakes") == 1 and store.reload_failures == 1
    assert store.tenant_for("Bearer sk-a") == "alpha" and not store.stale
    for revoked in ("sk-b", "sk-c"):
        with pytest.raises(AuthenticationFailed):
            store.tenant_for(f"Bearer {revoked}")


def test_removing_a_key_revokes_it_even_when_its_tenant_table_stays(tmp_path):
    """Issue 34's defect: alpha's [tenants.alpha] table outlived its key, the
    reload failed on it, and the old key set (alpha's key with it) stayed."""
    f = tmp_path / "keys.toml"
    table = "\n[tenants.alpha]\nweight = 2\n\n[tenants.beta]\nweight = 3\n"
    f.write_text('[keys]\n"sk-a" = "alpha"\n"sk-b" = "beta"\n' + table)
    store = KeyStore(f)
    assert store.tenant_for("Bearer sk-a") == "alpha"
    f.write_text('[keys]\n"sk-b" = "beta"\n' + table)  # alpha's line deleted, its table left behind
    later(f)
    reload(store)
    with pytest.raises(AuthenticationFailed):
        store.tenant_for("Bearer sk-a")
    assert store.tenant_for("Bearer sk-b") == "beta" and not store.stale
    assert "no API key names tenant 'alpha'" in store.reload_error
    assert "keys and operator keys applied" in store.reload_error
    assert store.policy("beta").weight == 3.0  # the last good table stays for the tenants still there


def test_an_operator_key_removed_while_the_tenant_table_is_wrong_is_revoked(tmp_path):
    f = tmp_path / "keys.toml"
    f.write_text('[keys]\n"sk-a" = "alpha"\n\n[operators]\n"sk-ops" = "ops"\n"sk-old" = "old"\n')
    store = KeyStore(f)
    f.write_text('[keys]\n"sk-a" = "alpha"\n\n[operators]\n"sk-ops" = "ops"\n\n[tenants.alpha]\nweight = 0\n')
    later(f)
    reload(store)
    with pytest.raises(AuthenticationFailed):
        store.operator_for("Bearer sk-old")
    assert store.operator_for("Bearer sk-ops") == "ops"


def test_a_key_made_both_a_tenants_and_an_operators_on_reload_opens_nothing(tmp_path):
    f = tmp_path / "keys.toml"
    f.write_text('[keys]\n"sk-a" = "alpha"\n"sk-x" = "xray"\n')
    store = KeyStore(f)
    f.write_text('[keys]\n"sk-a" = "alpha"\n"sk-x" = "xray"\n\n[operators]\n"sk-x" = "ops"\n')
    later(f)
    reload(store)
    with pytest.raises(AuthenticationFailed):
        store.tenant_for("Bearer sk-x")
    with pytest.raises(AuthenticationFailed):
        store.operator_for("Bearer sk-x")
    assert "either a tenant's or an operator's" in store.reload_error


def test_an_unreadable_file_keeps_the_last_keys_and_says_revocations_are_not_in_force(tmp_path, caplog):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha"})
    store = KeyStore(f)
    f.write_text('[keys\n"sk-a" = "alpha"\n')  # not TOML
    later(f)
    with caplog.at_level("ERROR"):
        reload(store)
    assert store.stale and "REVOCATIONS IN THIS FILE ARE NOT IN FORCE" in store.reload_error
    assert "NOT IN FORCE" in caplog.text
    write_keys(f, {})
    later(f, 4)
    reload(store)
    assert not store.stale and store.reload_error is None
    with pytest.raises(AuthenticationFailed):
        store.tenant_for("Bearer sk-a")


def test_a_vanished_file_keeps_the_keys_and_its_return_clears_the_error(tmp_path):
    f = tmp_path / "keys.toml"
    write_keys(f, {"sk-a": "alpha"})
    store = KeyStore(f)
    stat = f.stat()
    f.unlink()
    reload(store)
    assert store.tenant_for("Bearer sk-a") == "alpha" and "No such file" in store.reload_error and store.stale
    write_keys(f, {"sk-a": "alpha"})
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # back with the same mtime
    reload(store)
    assert store.reload_error is None


def test_operator_keys_open_operator_endpoints_only(tmp_path):
    f = tmp_path / "keys.toml"
    f.write_text('[keys]\n"sk-a" = "alpha"\n\n[operators]\n"sk-ops" = "ops"\n')
    store = KeyStore(f, operator_env_value="sk-env-ops=pager")
    assert store.operator_for("Bearer sk-ops") == "ops" and store.operator_for("Bearer sk-env-ops") == "pager"
    assert store.operators == {"ops", "pager"} and store.tenants == {"alpha"}
    with pytest.raises(PermissionDenied):
        store.operator_for("Bearer sk-a")
    with pytest.raises(PermissionDenied):
        store.tenant_for("Bearer sk-ops")
    with pytest.raises(AuthenticationFailed):
        store.operator_for(None)


def test_a_key_cannot_be_both_a_tenants_and_an_operators(tmp_path):
    f = tmp_path / "keys.toml"
    f.write_text('[keys]\n"sk-a" = "alpha"\n\n[operators]\n"sk-a" = "ops"\n')
    with pytest.raises(ValueError, match=r"keys.toml:5: \[operators\] a key is either"):
        KeyStore(f)
