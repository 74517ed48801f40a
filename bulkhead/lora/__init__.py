"""Tenant-private LoRA adapters (issue 37).

An adapter belongs to one tenant: the operator names it in keys.toml under
`[tenants.NAME.adapters]`, a request selects it with `model: "<adapter>"`,
and the name is resolved in the caller's tenant only (registry.py). An
adapter directory is untrusted input (peft_files.py): safetensors only, its
config and every shape checked against the base model before anything is
loaded, and a digest of its weights that the signed ticket carries so that
a worker holding other weights refuses instead of decoding with them.

This package loads no torch: the router resolves names and validates files
without a model; the workers turn the validated files into tensors.
"""
