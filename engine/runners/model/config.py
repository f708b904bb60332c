"""The shape of a Llama-family model: built-in tiny default, or read from a HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kvroute.engine.core.work import RunnerInfo

# Architectures whose forward is exactly ours: Llama layers, optional q/k/v(/o) biases.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, slots=True)
class Llama3RopeScaling:
    """`rope_scaling: {"rope_type": "llama3", ...}` of Llama 3.1+ checkpoints."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.low_freq_factor <= 0:
            raise ValueError("llama3 rope scaling needs a positive factor and low_freq_factor")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rope scaling needs high_freq_factor > low_freq_factor")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    vocab_size: int = 8192
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    name: str = "kvroute-tiny"
    rope_scaling: Llama3RopeScaling | None = None
    eos_token_id: int | None = None
    qkv_bias: bool = False  # Qwen2 (and Llama with attention_bias) add biases to q/k/v
    o_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_position_embeddings"):
            if getattr(self, field) <= 0:
                raise ValueError(f"model config field {field} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be positive")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not self.name:
            raise ValueError("a model config needs a non-empty name")

    @classmethod
    def tiny(cls) -> ModelConfig:
        """The built-in default: random weights, small enough for one CPU thread."""
        return cls()

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def runner_info(self) -> RunnerInfo:
        """What a runner of this model tells the engine about it (the torch and the sim runner alike)."""
        return RunnerInfo(model=self.name, vocab_size=self.vocab_size, max_model_len=self.max_position_embeddings,
                          eos_token_id=self.eos_token_id, dtype=self.dtype, num_layers=self.num_layers,
                          num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face Llama-family `config.json`; refuse what our forward can't run."""
        path = Path(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ValueError(f"no config.json in model directory {path}")
        return cls.from_hf_dict(json.loads(config_file.read_text()), name=path.name)

    @classmethod
    def from_hf_dict(cls, hf: dict, name: str) -> ModelConfig:
        arch = (hf.get("architectures") or ["<none given>"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {arch} is not supported; kvroute runs {', '.join(SUPPORTED_ARCHITECTURES)}")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only silu is")
        num_heads = hf["num_attention_heads"]
        max_pos = hf.get("max_position_embeddings", 2048)
        window = None if hf.get("use_sliding_window") is False else hf.get("sliding_window")
        if window:  # never attend beyond the window: cap the context instead of masking
            max_pos = min(max_pos, window)
        theta, scaling = _rope_params(hf)
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        eos = hf.get("eos_token_id")
        attention_bias = bool(hf.get("attention_bias", False))
        qkv_bias, o_bias = (True, False) if arch == "Qwen2ForCausalLM" else (attention_bias, attention_bias)
        return cls(
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            intermediate_size=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_position_embeddings=max_pos,
            rope_theta=theta,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dtype=dtype,
            name=name,
            rope_scaling=scaling,
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
        )


def _rope_params(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """Both spellings: transformers 5 `rope_parameters`, older `rope_theta` + `rope_scaling`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"rope scaling of type {rope_type!r} is not supported; only llama3 is")
    scaling = Llama3RopeScaling(
        factor=params["factor"],
        low_freq_factor=params["low_freq_factor"],
        high_freq_factor=params["high_freq_factor"],
        original_max_position_embeddings=params["original_max_position_embeddings"],
    )
    return theta, scaling
