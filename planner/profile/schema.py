"""The profile file (``planner.profile/v1``): measured per-layer times of one device.

A profile records, for one device and one model shape, the forward and backward time (and,
where measured, the backward's input- and weight-gradient parts apart) and the peak memory of the three layer kinds of DESIGN §2 (``embedding``, ``block``, ``head``) at
several micro-batch sizes and tensor-parallel degrees.  An entry that did not fit in memory is
kept as ``fits: false`` so that readers know it was tried.

Plain numbers are in the unit their name ends in (seconds, bytes): a profile is written by a
program, not by hand, so unit strings would only add parsing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from planner.spec.quantities import PositiveInt
from planner.spec.source import FieldValueError

SCHEMA_ID = "planner.profile/v1"
LAYER_KINDS = ("embedding", "block", "head")
LayerKind = Literal["embedding", "block", "head"]
Dtype = Literal["bf16", "fp16", "fp32", "tf32"]  # tf32: fp32 tensors, TF32 tensor-core matmuls

_FROZEN = ConfigDict(frozen=True, extra="forbid")
# ``settings.memory`` of a profile without memory figures (``planner profile --from-run``);
# only such a file may leave out ``peak_memory_bytes``.
MEMORY_NOT_MEASURED = "not measured"


class DeviceInfo(BaseModel):
    model_config = _FROZEN

    kind: Literal["cpu", "cuda"]
    name: str = Field(min_length=1, description="torch.cuda.get_device_name, or the CPU model")
    gpu_type: str | None = Field(
        default=None, description="GPU type it maps to (catalog id or an inline type's name); "
        "when absent the device name is looked up in the catalog")
    threads: PositiveInt | None = Field(default=None, description="torch threads (CPU runs)")


class MeasureSettings(BaseModel):
    model_config = _FROZEN

    warmup: int = Field(ge=0)
    repeats: PositiveInt
    statistic: Literal["median", "mean"] = "median"  # mean: --concurrent runs (cotenants.py)
    timer: str = Field(description="how times were taken (cuda-events | thread-cpu-time | wall-clock)")
    memory: str = Field(description="how peak memory was obtained")
    concurrent: PositiveInt | None = Field(
        default=None, description="measured as one of this many processes running at once (CPU)")
    load_average: tuple[float, float] | None = Field(
        default=None, description="1-minute load average before and after (CPU noise indicator)")


class ProfileEntry(BaseModel):
    """One measured (layer kind, micro-batch, tp) point; times of one micro-batch, one TP rank."""

    model_config = _FROZEN

    layer: LayerKind
    micro_batch: PositiveInt
    tp: PositiveInt
    fits: bool = True
    forward_s: float | None = Field(default=None, allow_inf_nan=False)
    backward_s: float | None = Field(default=None, allow_inf_nan=False)
    peak_memory_bytes: int | None = Field(default=None, ge=0)
    activation_bytes: int | None = Field(
        default=None, ge=0, description="tensors autograd saved for backward")
    # The backward split as zero-bubble schedules run it (torch.distributed.pipelining's
    # stage_backward_input, then stage_backward_weight); optional: older profiles have neither.
    backward_input_s: float | None = Field(
        default=None, allow_inf_nan=False, description="gradient w.r.t. the layer input (I)")
    backward_weight_s: float | None = Field(
        default=None, allow_inf_nan=False, description="gradient w.r.t. the weights (W)")

    @field_validator("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
    @classmethod
    def _positive(cls, value, info):
        # A zero or negative time is a broken measurement, never a fast layer.
        if value is not None and value <= 0:
            raise ValueError(f"{info.field_name} must be a positive time in seconds, got {value!r}")
        return value

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo):
        if not self.fits:
            return self
        # A profile derived from a training run's step times (``settings.memory`` is
        # MEMORY_NOT_MEASURED) has no memory figures; ``parse_profile`` says so in the context.
        memory_measured = not (info.context or {}).get(MEMORY_NOT_MEASURED, False)
        for name in ("forward_s", "backward_s", "peak_memory_bytes"):
            if name == "peak_memory_bytes" and not memory_measured:
                continue
            if getattr(self, name) is None:
                raise ValueError(f"missing required field {name!r} (or write 'fits: false' for "
                                 "an entry that ran out of memory)")
        if (self.backward_input_s is None) != (self.backward_weight_s is None):
            raise ValueError("backward_input_s and backward_weight_s come together (the two parts "
                             "of one split backward); give both or neither")
        return self

    @property
    def weight_fraction(self) -> float | None:
        """W's share of the split backward, W / (I + W); None when the split was not measured."""
        if self.backward_input_s is None or self.backward_weight_s is None:
            return None
        return self.backward_weight_s / (self.backward_input_s + self.backward_weight_s)


class ModelShape(BaseModel):
    """The model mapping of DESIGN §2 (as ``ModelSpec.to_mapping`` writes it)."""

    model_config = _FROZEN

    name: str = "custom"
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    ffn_hidden_size: PositiveInt
    mlp: Literal["gelu", "swiglu"]
    vocab_size: PositiveInt
    tied_embeddings: bool = False
    # Written only where they depart from GPT style (ModelSpec.to_mapping); not priced.
    position_embedding: Literal["learned", "rope"] = "learned"
    rotary_base: PositiveInt | None = None
    rope_scaling_factor: float | None = Field(default=None, gt=0)
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    linear_bias: bool = True


class ProfileFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: Literal["planner.profile/v1"] = Field(alias="schema")
    device: DeviceInfo
    torch_version: str
    dtype: Dtype
    stands_in_for: tuple[Dtype, ...] = Field(
        default=(), description="plan precisions besides dtype this file may price, on purpose "
        "(written by hand; e.g. fp32 CPU timings for bf16 plans the CPU runner runs in fp32)")
    attention: Literal["fused", "unfused"] = Field(
        default="fused", description="how the blocks' attention core ran: 'fused' is "
        "F.scaled_dot_product_attention(is_causal=True) as measure.py runs it (no s x s tensor in "
        "memory; flash kernels on CUDA), so pricing the profile needs the cost model's "
        "flash_attention=True; 'unfused' is the reference runner's explicit softmax (profile --from-run)")
    created: str = Field(description="UTC date and time of the measurement, ISO 8601")
    seq_len: PositiveInt
    model: ModelShape
    settings: MeasureSettings
    provenance: str | None = Field(default=None, description="free text: command line, notes")
    entries: tuple[ProfileEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _memory(self):
        if self.settings.memory == MEMORY_NOT_MEASURED:
            return self
        for i, e in enumerate(self.entries):
            if e.fits and e.peak_memory_bytes is None:
                raise ValueError(f"entries[{i}]: missing required field 'peak_memory_bytes' (only a "
                                 f"profile whose settings.memory is {MEMORY_NOT_MEASURED!r} may omit it)")
        return self

    @model_validator(mode="after")
    def _unique(self):
        seen = {}
        for i, e in enumerate(self.entries):
            key = (e.layer, e.micro_batch, e.tp)
            if key in seen:
                # at the second entry's line (it was reported at the file's 1:1)
                raise FieldValueError(("entries", i), f"entries list {e.layer} micro_batch={e.micro_batch} "
                                      f"tp={e.tp} twice (first as entries[{seen[key]}])")
            seen[key] = i
        return self

    @field_validator("stands_in_for")
    @classmethod
    def _distinct(cls, value, info):
        if len(set(value)) != len(value):
            raise ValueError(f"stands_in_for lists a precision twice: {list(value)}")
        if info.data.get("dtype") in value:
            raise ValueError(f"stands_in_for need not list the file's own dtype {info.data['dtype']!r}")
        return value

    def serves(self, precision: str) -> bool:
        """Whether this file may price a plan trained in ``precision``."""
        return precision == self.dtype or precision in self.stands_in_for

    def to_yaml_data(self) -> dict:
        """Plain data in a stable key order, for writing."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not data.get("stands_in_for"):
            data.pop("stands_in_for", None)
        data["entries"] = [_entry_data(e) for e in self.entries]
        head = ["schema", "device", "torch_version", "dtype", "stands_in_for", "attention", "created",
                "seq_len", "model", "settings", "provenance", "entries"]
        return {k: data[k] for k in head if k in data}


def _entry_data(entry: ProfileEntry) -> dict:
    out = {"layer": entry.layer, "micro_batch": entry.micro_batch, "tp": entry.tp}
    if not entry.fits:
        out["fits"] = False
        return out
    out.update(forward_s=float(f"{entry.forward_s:.6g}"), backward_s=float(f"{entry.backward_s:.6g}"))
    if entry.peak_memory_bytes is not None:
        out["peak_memory_bytes"] = entry.peak_memory_bytes
    if entry.activation_bytes is not None:
        out["activation_bytes"] = entry.activation_bytes
    if entry.weight_fraction is not None:
        out.update(backward_input_s=float(f"{entry.backward_input_s:.6g}"),
                   backward_weight_s=float(f"{entry.backward_weight_s:.6g}"))
    return out


# The model fields that decide each layer kind's cost: a profile of one model serves any other
# model whose layer has the same shape (e.g. a deeper model with the same blocks).
SHAPE_FIELDS = {
    "embedding": ("hidden_size", "vocab_size"),
    "block": ("hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "mlp"),
    "head": ("hidden_size", "vocab_size"),
}


# Block fields a model mapping carries only where they apply (ModelSpec.to_mapping): a MoE or
# wide-head model's block never takes a dense profile's time (planner profile measures dense
# blocks only), while dense models' keys stay as they were.
OPTIONAL_BLOCK_FIELDS = ("head_dim", "num_experts", "moe_top_k", "moe_ffn_hidden_size",
                         "num_shared_experts", "shared_expert_ffn_hidden_size",
                         "first_k_dense_layers", "moe_layer_freq")


def layer_shape(model: dict, layer: str) -> tuple:
    shape = tuple(model[f] for f in SHAPE_FIELDS[layer])
    if layer == "block":
        shape += tuple((f, model[f]) for f in OPTIONAL_BLOCK_FIELDS if f in model)
    return shape
