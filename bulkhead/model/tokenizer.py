"""The model's own tokenizer (tokenizer.json) and chat template (Jinja)."""

from __future__ import annotations

import json
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer


class ChatTemplateError(ValueError):
    pass


class Tokenizer:
    def __init__(self, model_dir: Path):
        model_dir = Path(model_dir)
        self._tok = _HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template = cfg.get("chat_template")
        if (model_dir / "chat_template.jinja").exists():
            template = (model_dir / "chat_template.jinja").read_text()
        self.bos_token = cfg.get("bos_token")
        self.eos_token = cfg.get("eos_token")
        # Templates come with the model; render them sandboxed all the same.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(template) if template else None
        # A template that mentions tools renders them (and calls, and results) itself.
        self.template_knows_tools = bool(template) and "tools" in template
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def to_json(self) -> str:
        """tokenizer.json as text (the grammar library builds its own view of the vocabulary from it)."""
        return self._tok.to_str()

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        if self._template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        return self._template.render(
            messages=messages, add_generation_prompt=True, bos_token=self.bos_token or "", eos_token=self.eos_token or "",
            tools=tools,
        )


def _raise(message: str):
    raise ChatTemplateError(message)


class IncrementalDetokenizer:
    """Text deltas for a growing token list, holding back incomplete UTF-8.

    Decodes a short window (not the whole output) each step, so the cost per
    token stays constant however long the answer gets.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self.ids: list[int] = []
        self._prefix_start = 0  # window start
        self._read_end = 0  # tokens already turned into text
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._tok.decode(self.ids[self._prefix_start : self._read_end])
        full = self._tok.decode(self.ids[self._prefix_start :])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""  # wait: a character is split across tokens
        delta = full[len(prefix) :]
        self._prefix_start = self._read_end
        self._read_end = len(self.ids)
        self.text += delta
        return delta
