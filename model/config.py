"""GPT-2 configuration: one dataclass, the published shapes, and HF config.json read/write."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

# Activation names under which HF GPT-2 configs spell the tanh form of GELU that GPT-2 uses.
TANH_GELU_NAMES = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024  # context window
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int = 50256
    # Experiment switches. "post" is the original Transformer block (Post-LN); final_norm=False
    # drops ln_f, the LayerNorm that GPT-2 has and that the seed article's pseudocode forgot.
    norm_position: str = "pre"
    final_norm: bool = True

    def __post_init__(self):
        if self.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {self.norm_position!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def parameter_count(self) -> int:
        """GPT2(self).num_parameters(), known from config.json alone, before any weight is read."""
        e = self.n_embd
        # ln_1 and ln_2 (2e each), c_attn (3e² + 3e), attn.c_proj (e² + e), c_fc (4e² + 4e), mlp.c_proj (4e² + e)
        per_block = 12 * e * e + 13 * e
        return (self.vocab_size + self.n_positions) * e + self.n_layer * per_block + (2 * e if self.final_norm else 0)

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPT2Config":
        """The shape of a released GPT-2 model: gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2."""
        key = name.split("/")[-1]
        if key not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return replace(PRESETS[key], **overrides)

    # --- HF config.json -------------------------------------------------------------------
    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], activation_function="gelu_new",
                 bos_token_id=self.eos_token_id, n_ctx=self.n_positions, tie_word_embeddings=True)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config") -> "GPT2Config":
        """Read an HF GPT-2 config dict; refuse configs this network cannot reproduce exactly."""
        if d.get("model_type") != "gpt2":
            raise ValueError(f"{source}: model_type is {d.get('model_type')!r}, not 'gpt2'; "
                             "only GPT-2 checkpoints can be loaded")
        unsupported = {
            "activation_function": d.get("activation_function", "gelu_new") not in TANH_GELU_NAMES,
            "n_inner": d.get("n_inner") not in (None, 4 * d.get("n_embd", 768)),
            "scale_attn_by_inverse_layer_idx": bool(d.get("scale_attn_by_inverse_layer_idx")),
            "reorder_and_upcast_attn": bool(d.get("reorder_and_upcast_attn")),
            "scale_attn_weights": d.get("scale_attn_weights", True) is False,
        }
        bad = [k for k, is_bad in unsupported.items() if is_bad]
        if bad:
            raise ValueError(f"{source}: unsupported GPT-2 variant ({', '.join(f'{k}={d.get(k)!r}' for k in bad)})")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known and v is not None}
        return cls(**kwargs)

    def save(self, directory: str | Path) -> None:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.to_hf_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "GPT2Config":
        path = Path(directory) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json in {directory}")
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_hf_dict(d, source=str(path))


PRESETS = {
    "gpt2": GPT2Config(),
    "gpt2-medium": GPT2Config(n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": GPT2Config(n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": GPT2Config(n_embd=1600, n_layer=48, n_head=25),
    "distilgpt2": GPT2Config(n_layer=6),
}
