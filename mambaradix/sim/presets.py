"""Model presets: how big one recurrent-state slot and one token of KV are,
and what prefilling a token costs, for a few hybrid models and TP degrees.

A state slot holds, for every recurrent layer, the convolution window
(``conv_dim / tp`` channels x ``conv_kernel - 1`` positions) and the SSM /
gated-delta-net state (``ssm_shape`` with its first axis split over TP), as
SGLang's ``Mamba2StateShape`` lays them out.  dtypes follow SGLang's
defaults: conv bf16, SSM fp32 (``--mamba-ssm-dtype`` unset).

Sources and assumptions:

* **qwen3-next** (Qwen3-Next-80B-A3B): 48 layers with full attention every
  4th, so 36 gated-delta-net layers and 12 attention layers;
  ``linear_num_key_heads`` 16, ``linear_num_value_heads`` 32, key / value
  head dim 128, conv kernel 4, so conv_dim = 128*32 + 2*16*128 = 8192 and
  the SSM state is (32, 128, 128).  Per layer at TP1: conv (8192, 3) bf16 =
  48 KiB, SSM (32, 128, 128) fp32 = 2 MiB; 36 layers = **77,266,944 B**
  (the project's SGLang digest, section 4.1).  Attention: 16 query heads,
  2 KV heads, head dim 256.  Active parameters ~3B (the "A3B").
* **nemotron-h-8b** (nvidia/Nemotron-H-8B-Base-8K public config):
  ``hybrid_override_pattern`` of 52 layers = 24 Mamba-2 ("M"), 4 attention
  ("*") and 24 MLP ("-") layers; hidden 4096, ``mamba_num_heads`` 128,
  ``mamba_head_dim`` 64, ``ssm_state_size`` 128, ``n_groups`` 8,
  ``conv_kernel`` 4, so conv_dim = 128*64 + 2*8*128 = 10,240 and the SSM state
  is (128, 64, 128).  Per layer at TP1: 61,440 + 4,194,304 B; 24 layers =
  **102,137,856 B**.  Attention: 32 query heads, 8 KV heads, head dim 128.
  ~8B parameters, all active (dense).
* **jamba-like** (the shape of ai21labs/Jamba-v0.1's public config): 32 layers,
  attention every 8th (``attn_layer_period`` 8), so 28 Mamba-1 layers and
  4 attention layers; hidden 4096, ``mamba_expand`` 2 (d_inner 8192),
  ``mamba_d_state`` 16, ``mamba_d_conv`` 4.  Mamba-1 keeps a conv window
  (8192, 3) and an SSM state (8192, 16) per layer: 49,152 + 524,288 B; 28
  layers = **16,056,320 B**.  Attention: 32 query heads, 8 KV heads, head dim
  128.  ~12B active parameters (of 52B; MoE every other layer).

KV bytes per token count K and V in bf16 for the attention layers, with the
KV heads split over TP (replicated when TP exceeds them).

Prefill FLOPs of a token at position p (0-based) are modelled as
``2 * active_params + 4 * attn_layers * q_heads * head_dim * p``: a
multiply-add per active weight, plus QK^T and PV over the p earlier
tokens.  The recurrent layers' own scan is small next to their projections
(which the parameter count includes) and is not counted separately.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from .types import SimConfig

__all__ = ["ModelPreset", "PRESETS", "PRESET_ATTRS", "get_preset", "apply_preset", "parse_size",
           "format_bytes"]


@dataclass(frozen=True)
class ModelPreset:
    """Sizes of one hybrid model, per GPU at a TP degree."""

    name: str
    description: str
    state_layers: int          # recurrent (Mamba / GDN) layers
    conv_dim: int              # channels of the conv window, before TP
    conv_kernel: int
    ssm_shape: tuple[int, ...]  # per layer, before TP; axis 0 is split by TP
    attn_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    active_params: float
    conv_bytes: int = 2        # bf16
    ssm_bytes: int = 4         # fp32
    kv_bytes: int = 2          # bf16
    source: str = ""

    def check_tp(self, tp: int) -> None:
        """Raise TypeError unless tp is an integer, ValueError unless it is
        >= 1 and splits the state and the heads evenly."""
        if isinstance(tp, (bool, np.bool_)) or not isinstance(tp, numbers.Integral):
            raise TypeError(f"tp must be an integer >= 1, got {tp!r}")
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        for what, n in (("conv channels", self.conv_dim), ("state heads", self.ssm_shape[0]),
                        ("query heads", self.q_heads)):
            if n % tp:
                raise ValueError(f"tp={tp} does not divide the {n} {what} of {self.name}")

    def state_bytes_per_slot(self, tp: int = 1) -> int:
        """Bytes of one state slot (all recurrent layers) on one GPU."""
        self.check_tp(tp)
        ssm = 1
        for d in self.ssm_shape:
            ssm *= d
        per_layer = (self.conv_dim // tp) * (self.conv_kernel - 1) * self.conv_bytes \
            + (ssm // tp) * self.ssm_bytes
        return self.state_layers * per_layer

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes of KV of one token (all attention layers) on one GPU."""
        self.check_tp(tp)
        kv_heads = max(1, self.kv_heads // tp)
        return self.attn_layers * 2 * kv_heads * self.head_dim * self.kv_bytes

    @property
    def flops_per_token(self) -> float:
        """Position-independent prefill FLOPs per token (2 x active params)."""
        return 2.0 * self.active_params

    @property
    def attn_flops_per_token_position(self) -> float:
        """Extra attention FLOPs per token per earlier token in its context."""
        return 4.0 * self.attn_layers * self.q_heads * self.head_dim

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill positions [start, end) with [0, start) already cached
        (whole model, all GPUs together)."""
        for name, value in (("start", start), ("end", end)):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer >= 0, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if end <= start:
            return 0.0
        n = end - start
        positions = (start + end - 1) * n / 2.0  # sum of p over [start, end)
        return self.flops_per_token * n + self.attn_flops_per_token_position * positions

    def policy_options(self, tp: int = 1, alpha: float = 16.0, tune_window: int = 64,
                       mru: bool = True) -> dict:
        """The ``policy_options`` of ``RadixTree`` / ``Lifecycle`` /
        ``MambaRadixCache`` for ``lru_policy="utility"`` with this model's
        costs (state and KV bytes per GPU at tp), the simulator's defaults
        (alpha 16 tuned every 64 insertions, the recency order reversed).
        alpha and tune_window follow SimConfig's utility_alpha and tune_window
        rules (checks.check_field; a ConfigError names them)."""
        from .checks import check_field  # (checks imports this module)

        check_field("utility_alpha", alpha)
        check_field("tune_window", tune_window)
        return {"alpha": float(alpha), "flops_per_token": self.flops_per_token,
                "attn_flops_per_pos": self.attn_flops_per_token_position,
                "state_bytes": float(self.state_bytes_per_slot(tp)),
                "kv_bytes_per_token": float(self.kv_bytes_per_token(tp)),
                "tune_window": int(tune_window), "mru": int(bool(mru))}

    def summary(self, tp: int = 1) -> str:
        return (f"{self.name} tp={tp}: state {format_bytes(self.state_bytes_per_slot(tp))}/slot, "
                f"KV {format_bytes(self.kv_bytes_per_token(tp))}/token")


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="qwen3-next",
            description="Qwen3-Next-80B-A3B: 36 gated-delta-net + 12 attention layers",
            state_layers=36, conv_dim=8192, conv_kernel=4, ssm_shape=(32, 128, 128),
            attn_layers=12, q_heads=16, kv_heads=2, head_dim=256, active_params=3.0e9,
            source="SGLang qwen3_next config + mamba_utils (project digest, section 4.1)",
        ),
        ModelPreset(
            name="nemotron-h-8b",
            description="Nemotron-H-8B: 24 Mamba-2 + 4 attention + 24 MLP layers",
            state_layers=24, conv_dim=10240, conv_kernel=4, ssm_shape=(128, 64, 128),
            attn_layers=4, q_heads=32, kv_heads=8, head_dim=128, active_params=8.0e9,
            source="nvidia/Nemotron-H-8B-Base-8K config.json",
        ),
        ModelPreset(
            name="jamba-like",
            description="Jamba-v0.1 shape: 28 Mamba-1 + 4 attention layers, 12B active",
            state_layers=28, conv_dim=8192, conv_kernel=4, ssm_shape=(8192, 16),
            attn_layers=4, q_heads=32, kv_heads=8, head_dim=128, active_params=12.0e9,
            source="ai21labs/Jamba-v0.1 config.json",
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called name (case-insensitive); ValueError lists the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"a model preset name must be a str (one of {', '.join(PRESETS)}), "
                        f"got {name!r}")
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[key]


#: What a preset tells the replay engine about the model (bytes of a state slot
#: for the copied / donated bytes, FLOPs per token for the FLOPs saved).
PRESET_ATTRS = ("state_bytes_per_slot", "flops_per_token", "attn_flops_per_pos", "kv_bytes_per_token")


def apply_preset(config: SimConfig, preset: Union[ModelPreset, str], tp: int = 1) -> SimConfig:
    """A copy of config carrying the model's state bytes per slot (at tp) and
    prefill FLOPs per token, which the engine reads to report state bytes
    copied / donated and FLOPs saved.  They are set as fields where SimConfig
    has them, else as attributes of the returned instance (so apply the
    preset after any dataclasses.replace)."""
    if not isinstance(config, SimConfig):
        raise TypeError(f"config must be a SimConfig, got {type(config).__name__}")
    if not isinstance(preset, ModelPreset):
        preset = get_preset(preset)
    values = {"state_bytes_per_slot": preset.state_bytes_per_slot(tp),
              "flops_per_token": preset.flops_per_token,
              "attn_flops_per_pos": preset.attn_flops_per_token_position,
              "kv_bytes_per_token": preset.kv_bytes_per_token(tp)}
    names = {f.name for f in dataclasses.fields(SimConfig)}
    config = dataclasses.replace(config, **{k: v for k, v in values.items() if k in names})
    for k, v in values.items():
        if k not in names:
            object.__setattr__(config, k, v)
    return config


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
          "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(text: str) -> int:
    """Bytes from "80GiB", "512MiB", "1.5GB", "1e9" or a plain integer."""
    if not isinstance(text, str):
        raise TypeError(f"a size must be a str such as '8GiB' or '512MiB', got {text!r}")
    s = text.strip().lower().replace("_", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"cannot read a size from {text!r} (e.g. 8GiB, 512MiB, 2GB)")
    try:
        value = float(num) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"cannot read a size from {text!r} (e.g. 8GiB, 512MiB, 2GB)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"a size must be a finite number >= 0, got {text!r}")
    return int(value)


def format_bytes(n: Optional[float]) -> str:
    """1536 -> "1.5 KiB"."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"
