"""An adapter directory is untrusted input: each refusal names the file and the reason."""

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from bulkhead.lora.peft_files import AdapterRefused, read_adapter, read_weights
from bench.lora_adapters import TINY, write_adapter


def test_a_valid_adapter_reads_with_its_scaling_targets_and_digest(tmp_path):
    files = read_adapter(write_adapter(tmp_path / "a", rank=4, alpha=8, targets=("q_proj", "down_proj")), TINY)
    assert (files.rank, files.scaling) == (4, 2.0)
    assert files.targets == ((0, "down_proj"), (0, "q_proj"), (1, "down_proj"), (1, "q_proj"))
    assert len(files.digest) == 64 and files.nbytes > 0


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path):
    files = read_adapter(write_adapter(tmp_path / "a", rank=4, alpha=8, config={"use_rslora": True}), TINY)
    assert files.scaling == 4.0


def test_the_digest_follows_the_weights_not_the_name(tmp_path):
    a = read_adapter(write_adapter(tmp_path / "a", seed=1), TINY)
    same = read_adapter(write_adapter(tmp_path / "b", seed=1), TINY)
    other = read_adapter(write_adapter(tmp_path / "c", seed=2), TINY)
    rescaled = read_adapter(write_adapter(tmp_path / "d", seed=1, alpha=16), TINY)
    assert a.digest == same.digest
    assert len({a.digest, other.digest, rescaled.digest}) == 3


def test_a_pickle_is_never_loaded(tmp_path):
    path = write_adapter(tmp_path / "a")
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    with pytest.raises(AdapterRefused, match=r"adapter_model.safetensors: a pickle, which is never loaded"):
        read_adapter(path, TINY)


@pytest.mark.parametrize("config, reason", [
    ({"r": 65}, r"r must be a whole number from 1 to 64, got 65"),
    ({"r": 0}, r"got 0"),
    ({"r": True}, r"got True"),
    ({"lora_alpha": float("inf")}, r"lora_alpha must be a finite number > 0, got inf"),
    ({"lora_alpha": -1}, r"got -1"),
    ({"target_modules": ["q_proj", "lm_head"]}, r"\['lm_head'\] are not linear layers of the base model"),
    ({"target_modules": "nothing_here"}, r"matches none of"),
    ({"target_modules": []}, r"non-empty list"),
    ({"bias": "all"}, r"bias='all' is not supported"),
    ({"modules_to_save": ["lm_head"]}, r"modules_to_save=\['lm_head'\] is not supported"),
    ({"use_dora": True}, r"use_dora=True is not supported"),
    ({"rank_pattern": {"q_proj": 8}}, r"rank_pattern="),
    ({"peft_type": "IA3"}, r"only LORA adapters"),
])
def test_a_bad_config_is_refused_naming_the_file_and_the_field(tmp_path, config, reason):
    path = write_adapter(tmp_path / "a", config=config)
    with pytest.raises(AdapterRefused, match=reason) as e:
        read_adapter(path, TINY)
    assert "adapter_config.json" in str(e.value)


def test_a_regex_target_modules_is_read_as_peft_reads_it(tmp_path):
    path = write_adapter(tmp_path / "a", targets=("q_proj", "v_proj"), config={"target_modules": r".*[qv]_proj"})
    assert {m for _, m in read_adapter(path, TINY).targets} == {"q_proj", "v_proj"}


def _rewrite(path, edit):
    tensors = load_file(str(path / "adapter_model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize("edit, reason", [
    (lambda t: t.update({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 15)}),
     r"shape \[4, 15\], the base model's q_proj needs \[4, 16\] at rank 4"),
    (lambda t: t.update({"base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight": torch.zeros(4, 16)}),
     r"layer 7, the base model has 2"),
    (lambda t: t.update({"base_model.model.lm_head.weight": torch.zeros(4, 16)}),
     r"'base_model.model.lm_head.weight' is not a LoRA delta of a linear layer"),
    (lambda t: t.pop("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"),
     r"layer 1 up_proj has lora_A without its pair"),
    (lambda t: t.update({"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight": torch.zeros(4, 16)}),
     r"is not a LoRA delta"),
    (lambda t: t.update({k: v.to(torch.int32) for k, v in list(t.items())[:1]}), r"dtype I32"),
])
def test_a_tensor_that_does_not_fit_the_base_model_is_refused(tmp_path, edit, reason):
    path = write_adapter(tmp_path / "a")
    _rewrite(path, edit)
    with pytest.raises(AdapterRefused, match=reason):
        read_adapter(path, TINY)


def test_a_delta_outside_the_configs_target_modules_is_refused(tmp_path):
    path = write_adapter(tmp_path / "a", config={"target_modules": ["q_proj"]})
    with pytest.raises(AdapterRefused, match=r"_proj is not in the config.s target_modules"):
        read_adapter(path, TINY)


def test_size_and_rank_limits_are_the_callers(tmp_path):
    path = write_adapter(tmp_path / "a", rank=8)
    with pytest.raises(AdapterRefused, match=r"bytes, over the limit of 1000"):
        read_adapter(path, TINY, max_bytes=1000)
    with pytest.raises(AdapterRefused, match=r"from 1 to 4, got 8"):
        read_adapter(path, TINY, max_rank=4)


@pytest.mark.parametrize("content, reason", [
    (b"abc", r"shorter than its 8-byte header length"),
    (struct.pack("<Q", 1 << 40) + b"{}", r"a header of 1099511627776 bytes"),
    (struct.pack("<Q", 5) + b"nope!", r"header:"),
    (struct.pack("<Q", 2) + b"[]", r"not a JSON object"),
])
def test_a_weights_file_that_is_not_safetensors_is_refused(tmp_path, content, reason):
    path = write_adapter(tmp_path / "a")
    (path / "adapter_model.safetensors").write_bytes(content)
    with pytest.raises(AdapterRefused, match=reason):
        read_adapter(path, TINY)


def test_a_missing_directory_or_config_is_refused(tmp_path):
    with pytest.raises(AdapterRefused, match=r"not a directory"):
        read_adapter(tmp_path / "nowhere", TINY)
    path = write_adapter(tmp_path / "a")
    (path / "adapter_config.json").write_text("{")
    with pytest.raises(AdapterRefused, match=r"adapter_config.json: not readable as JSON"):
        read_adapter(path, TINY)
    (path / "adapter_config.json").write_text(json.dumps([1]))
    with pytest.raises(AdapterRefused, match=r"expected a JSON object"):
        read_adapter(path, TINY)


def test_validating_the_bytes_a_worker_read_gives_the_files_own_answer(tmp_path):
    """A worker validates, hashes and loads one read of the file (read_weights); the router reads from disk."""
    path = write_adapter(tmp_path / "a", rank=8)
    assert read_adapter(path, TINY, data=read_weights(path)) == read_adapter(path, TINY)
    with pytest.raises(AdapterRefused, match=r"over the limit of 1000"):
        read_adapter(path, TINY, max_bytes=1000, data=read_weights(path, max_bytes=1000))
