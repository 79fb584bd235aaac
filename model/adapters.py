"""Per-task LoRA adapters in PEFT's file format, switched per request on one base model.

An adapter directory holds adapter_config.json + adapter_model.safetensors as PEFT writes them,
for our model or for transformers' GPT2LMHeadModel (same module names; LoRA's A and B have the
same shapes on HF's Conv1D as on nn.Linear). Loading attaches forward hooks to the targeted
Linear layers and never touches the base weights, so switching costs nothing and with no
adapter active every layer returns exactly the base model's output.

Which adapter is active is a ContextVar set around a forward call (see `active_adapter`), so
two requests running in two threads each see their own choice. It may also name one adapter per
batch row, so that requests with different adapters share one batched forward call (the
scheduler's decode step).

The hooks work on any layer with in_features and out_features, int8-quantised ones too
(engine/quantize.py): the LoRA update stays in floating point on top of the base, as in QLoRA.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file

from .gpt2 import GPT2

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# In a checkpoint's adapters/ folder: {"on": [task, ...]}, the adapters the checkpoint's own
# evaluation found better than prompting the base alone, which the app starts switched on.
ON_BY_DEFAULT_FILE = "on_by_default.json"
PEFT_PREFIX = "base_model.model."

# An adapter switched on: its name, and how much of its update to add (1: as trained).
Choice = tuple[str, float]
# None (the base model), one choice for the whole batch, or {choice: its batch rows}.
ACTIVE: ContextVar[Choice | dict[Choice, torch.Tensor] | None] = ContextVar("active_adapter", default=None)


def as_choice(name: str | Choice | None, scale: float = 1.0) -> Choice | None:
    """(name, scale), or None where the row runs the base model: no adapter, or a scale of 0."""
    if isinstance(name, tuple):
        name, scale = name
    return None if name is None or scale == 0 else (name, float(scale))


@contextmanager
def active_adapter(name: str | Choice | None | Sequence[str | Choice | None], scale: float = 1.0):
    """Run the forward calls inside this block with adapter `name` on (None: the base model), its
    update scaled by `scale` (0: the base model exactly; 1: the adapter as trained).

    A sequence gives each batch row its own adapter, a name or a (name, scale) pair (None: that
    row runs the base model).
    """
    if name is None or isinstance(name, (str, tuple)):
        active = as_choice(name, scale)
    else:
        choices = [as_choice(row, scale) for row in name]
        if len(set(choices)) == 1:
            active = choices[0]  # the whole batch alike: one update over all rows
        else:
            # Index tensors made once here, not in each layer's hook.
            active = {c: torch.tensor([row for row, d in enumerate(choices) if d == c])
                      for c in dict.fromkeys(choices) if c is not None}
    token = ACTIVE.set(active)
    try:
        yield
    finally:
        ACTIVE.reset(token)


def adapter_names(model: GPT2) -> list[str]:
    return sorted(getattr(model, "lora_adapters", {}))


def check_adapter(model: GPT2, name: str | None) -> None:
    if name is not None and name not in adapter_names(model):
        raise ValueError(f"this model has no '{name}' adapter (it has: {', '.join(adapter_names(model)) or 'none'})")


def load_adapters(model: GPT2, root: str | Path) -> list[str]:
    """Load every adapter under root (one subdirectory each, named after its task), and which of
    them are on by default (ON_BY_DEFAULT_FILE, if there is one)."""
    root = Path(root)
    if not root.is_dir():
        return []
    names = [load_adapter(model, d, d.name) for d in sorted(root.iterdir()) if (d / CONFIG_FILE).is_file()]
    defaults = root / ON_BY_DEFAULT_FILE
    if defaults.is_file():
        try:
            on = json.loads(defaults.read_text())["on"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{defaults}: expected {{\"on\": [task, ...]}} ({type(e).__name__}: {e})") from None
        model.adapters_on_by_default = [name for name in on if name in names]
    return names


def write_on_by_default(root: str | Path, names: list[str]) -> None:
    """Write which of the adapters under root start on (read back by load_adapters)."""
    (Path(root) / ON_BY_DEFAULT_FILE).write_text(json.dumps({"on": list(names)}) + "\n")


def adapters_on_by_default(model: GPT2) -> list[str]:
    return list(getattr(model, "adapters_on_by_default", []))


def load_adapter(model: GPT2, directory: str | Path, name: str) -> str:
    directory = Path(directory)
    config = read_adapter_config(directory / CONFIG_FILE)
    weights_path = directory / WEIGHTS_FILE
    try:
        weights = load_file(weights_path)
    except Exception as e:
        raise ValueError(f"{weights_path}: cannot read adapter weights ({type(e).__name__}: {e})") from None
    modules = dict(model.named_modules())
    param = model.transformer.wte.weight
    updates: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for key, a in weights.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module_name = key.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
        b = weights.get(key.replace(".lora_A.", ".lora_B."))
        layer = modules.get(module_name)
        if b is None or not hasattr(layer, "in_features"):
            raise ValueError(f"{weights_path}: {key} does not match a Linear layer of this model with a lora_B")
        if a.shape[1] != layer.in_features or b.shape != (layer.out_features, a.shape[0]):
            raise ValueError(f"{weights_path}: {module_name} LoRA shapes {tuple(a.shape)}, {tuple(b.shape)} do not "
                             f"fit a {layer.in_features}->{layer.out_features} layer")
        rank = a.shape[0]
        scale = config["lora_alpha"] / (rank ** 0.5 if config.get("use_rslora") else rank)
        updates[module_name] = (a.to(param), b.to(param), scale)
    if not updates:
        raise ValueError(f"{weights_path}: no LoRA weights found")
    if not hasattr(model, "lora_adapters"):
        model.lora_adapters = {}
    model.lora_adapters[name] = updates
    for module_name in updates:
        layer = modules[module_name]
        if not getattr(layer, "has_lora_hook", False):
            layer.register_forward_hook(lora_hook(model, module_name))
            layer.has_lora_hook = True
    return name


def read_adapter_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read adapter config ({e})") from None
    unsupported = {
        "peft_type": config.get("peft_type") != "LORA",
        "use_dora": bool(config.get("use_dora")),
        "bias": config.get("bias", "none") != "none",
        "lora_bias": bool(config.get("lora_bias")),
        "modules_to_save": bool(config.get("modules_to_save")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
    }
    bad = [k for k, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(f"{path}: unsupported adapter settings: {', '.join(f'{k}={config.get(k)!r}' for k in bad)}")
    return config


def lora_hook(model: GPT2, module_name: str):
    def add_update(layer, inputs, output):
        active = ACTIVE.get()
        if active is None:
            return None  # keep the base output exactly
        chosen_rows = [(active, None)] if isinstance(active, tuple) else active.items()
        updates = [(rows, a, b, scale * strength) for (name, strength), rows in chosen_rows
                   if (update := model.lora_adapters.get(name, {}).get(module_name)) is not None
                   for a, b, scale in [update]]
        if not updates:
            return None
        x = inputs[0]
        output = output.clone()  # rows that run the base model keep its output exactly
        for rows, a, b, scale in updates:
            if rows is None:
                output += lora_update(x, a, b, scale)  # in place: `output` is the clone above
            else:
                rows = rows.to(output.device)
                output.index_add_(0, rows, lora_update(x.index_select(0, rows), a, b, scale))
        return output
    return add_update


def lora_update(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """LoRA's low-rank update (x @ a.T) @ b.T * scale, with x (batch, tokens, in).

    As one product per batch row (bmm), so that a row's update is the same bits whatever the other
    rows of its call: a request gets the same text with its adapter alone or in a batched decode
    step beside others. One product over all rows would pick its kernel by their number."""
    batch = x.shape[0]
    return torch.bmm(torch.bmm(x, a.t().expand(batch, -1, -1)), b.t().expand(batch, -1, -1)) * scale
