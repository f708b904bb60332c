"""A checkpoint of random weights of a realistic shape, with the built-in tokenizer: nothing downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kvroute.benchmarks.gpu_check.plan import MAX_POS, SHAPES, VOCAB


def write_checkpoint(model_dir: Path, shape: str, device: str, seed: int = 0) -> dict:
    """config.json, model.safetensors (random weights, drawn on the device) and the built-in tokenizer."""
    import torch
    from safetensors.torch import save_file

    from kvroute.router.contract.tokenizer import DATA_DIR

    hidden, layers, heads, kv_heads, inter, dtype = SHAPES[shape]
    hd = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": hd, "intermediate_size": inter, "vocab_size": VOCAB, "max_position_embeddings": MAX_POS,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": dtype}
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (VOCAB, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (heads * hd, hidden),
                   p + "self_attn.k_proj.weight": (kv_heads * hd, hidden),
                   p + "self_attn.v_proj.weight": (kv_heads * hd, hidden),
                   p + "self_attn.o_proj.weight": (hidden, heads * hd),
                   p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)}
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, size in shapes.items():
        t = torch.ones(size, device=device) if name.endswith("norm.weight") else \
            torch.randn(size, generator=gen, device=device) * 0.02
        tensors[name] = t.to(getattr(torch, dtype)).cpu()
    model_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    for f in DATA_DIR.iterdir():
        shutil.copy(f, model_dir / f.name)
    return {"shape": shape, "params": sum(t.numel() for t in tensors.values()), "dtype": dtype, **config}
