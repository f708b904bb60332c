"""A tiny Hugging Face Llama checkpoint (seeded weights, kvroute's tokenizer files) for `--model DIR` tests."""

import shutil

import torch

from kvroute.router.contract.tokenizer import DATA_DIR


def build_checkpoint(path):
    """Write the checkpoint into the directory `path` (existing); returns the transformers model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (DATA_DIR / name).exists():
            shutil.copy(DATA_DIR / name, path / name)
    return model
