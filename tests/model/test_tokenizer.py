from bulkhead.model.tokenizer import IncrementalDetokenizer, Tokenizer


def test_chat_template_renders_the_models_own_format(smollm2_dir):
    tok = Tokenizer(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi<|im_end|>" in text


def test_incremental_detokenization_equals_full_decode(smollm2_dir):
    tok = Tokenizer(smollm2_dir)
    text = "Café 東京 — naïve 🙂 done."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(t) for t in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # split characters are held back


def test_encode_adds_no_special_tokens(smollm2_dir):
    tok = Tokenizer(smollm2_dir)
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.vocab_size == 49152
