"""A tokenizer directory for vision tests: the built-in tokenizer plus an `<image>` token and a
LLaVA-style layout (every image expands to `tokens_per_image` placeholder tokens)."""

from __future__ import annotations

import json
import pathlib
import shutil

import tokenizers

from kvroute.router.contract import tokenizer as tokenizer_module


def vision_tokenizer_dir(root: pathlib.Path, tokens_per_image: int = 20) -> pathlib.Path:
    data = pathlib.Path(tokenizer_module.__file__).parent / "data"
    out = root / "vision-tokenizer"
    shutil.copytree(data, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    image_id = tokenizers.Tokenizer.from_str(json.dumps(spec)).get_vocab_size(with_added_tokens=True)
    spec["added_tokens"].append({"id": image_id, "content": "<image>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(spec))
    (out / "config.json").write_text(json.dumps({"image_token_index": image_id}))
    (out / "processor_config.json").write_text(json.dumps({"image_seq_length": tokens_per_image}))
    return out
