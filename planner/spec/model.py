"""The transformer to train (DESIGN §2: Model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.spec.quantities import PositiveInt
from planner.spec.source import FieldValueError

# The GPT-style architecture (Megatron-LM's defaults): learned absolute positions, LayerNorm,
# biased linear layers. Fields at these values are left out of to_mapping so that plans and
# profiles of GPT-style models read as they did before the fields existed.
_GPT_STYLE = {"position_embedding": "learned", "normalization": "layernorm", "linear_bias": True,
              "rotary_base": None, "rope_scaling_factor": None}


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer: ``embedding, block_0 … block_{L-1}, head``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(default="custom", description="catalog id or a label")
    num_layers: PositiveInt = Field(description="transformer blocks")
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt | None = Field(default=None, description="GQA groups; default = heads")
    ffn_hidden_size: PositiveInt | None = Field(default=None, description="default 4 * hidden_size")
    mlp: Literal["gelu", "swiglu"] = "gelu"
    vocab_size: PositiveInt
    tied_embeddings: bool = False
    max_seq_len: PositiveInt | None = None
    # Architecture details the cost model does not price (norm weights and biases are a few
    # vectors per layer) but a launcher must pass, or it trains a different model.
    position_embedding: Literal["learned", "rope"] = Field(
        default="learned", description="learned absolute position table, or rotary (RoPE)")
    rotary_base: PositiveInt | None = Field(default=None, description="RoPE theta; rope only")
    rope_scaling_factor: float | None = Field(
        default=None, gt=0, description="Llama 3.1-style RoPE frequency scaling factor; rope only")
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    linear_bias: bool = Field(default=True, description="bias vectors in the linear layers")
    # Attention heads wider than hidden / heads (Qwen3: 32 heads of 128 on a 2048 model): Q and
    # the output projection are heads x head_dim wide.  Written `head_dim` as in config.json.
    attention_head_dim: PositiveInt | None = Field(
        default=None, alias="head_dim", description="per-head width; default hidden_size / heads")
    # Mixture of Experts (absent: a dense model).  A MoE layer's MLP is a router (h x E) and E
    # expert MLPs of moe_ffn_hidden_size, each token going to its top_k; shared experts run on
    # every token (one MLP of their summed width).  Layers 0 .. first_k_dense_layers - 1 keep the
    # dense MLP (ffn_hidden_size), as does every layer i with i % moe_layer_freq != 0
    # (DeepSeek-V3's first_k_dense_replace and moe_layer_freq in its config.json).
    num_experts: PositiveInt | None = Field(default=None, description="routed experts per MoE layer")
    moe_top_k: PositiveInt | None = Field(default=None, description="experts each token is routed to")
    moe_ffn_hidden_size: PositiveInt | None = Field(
        default=None, description="one routed expert's MLP width; default ffn_hidden_size")
    num_shared_experts: int = Field(default=0, ge=0, description="experts every token goes through")
    shared_expert_ffn_hidden_size: PositiveInt | None = Field(
        default=None, description="the shared experts' summed MLP width; default "
                                  "moe_ffn_hidden_size x num_shared_experts")
    first_k_dense_layers: int = Field(default=0, ge=0, description="leading layers with a dense MLP")
    moe_layer_freq: PositiveInt = Field(default=1, description="every n-th layer is MoE (from 0)")
    source: str | None = None
    aliases: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check_shape(self):
        if self.attention_head_dim is None and self.hidden_size % self.num_attention_heads:
            raise FieldValueError("num_attention_heads", f"num_attention_heads ({self.num_attention_heads}) "
                                  f"must divide hidden_size ({self.hidden_size}), or give head_dim")
        if self.num_attention_heads % self.kv_heads:
            raise FieldValueError("num_kv_heads", f"num_kv_heads ({self.kv_heads}) must divide "
                                  "num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.position_embedding != "rope":
            for name in ("rotary_base", "rope_scaling_factor"):
                if getattr(self, name) is not None:
                    raise FieldValueError(name, f"{name} applies to position_embedding: rope only "
                                     f"(this model has {self.position_embedding})")
        self._check_moe()
        return self

    def _check_moe(self) -> None:
        moe_only = ("moe_top_k", "moe_ffn_hidden_size", "shared_expert_ffn_hidden_size")
        if self.num_experts is None:
            given = [n for n in moe_only if getattr(self, n) is not None]
            given += [n for n, dense in (("num_shared_experts", 0), ("first_k_dense_layers", 0),
                                         ("moe_layer_freq", 1)) if getattr(self, n) != dense]
            if given:
                raise FieldValueError(given[0], f"{', '.join(given)} apply to Mixture-of-Experts models "
                                      "only: "
                                 "give num_experts too (or remove them)")
            return
        if self.moe_top_k is None:
            raise FieldValueError("moe_top_k", "a Mixture-of-Experts model (num_experts) needs moe_top_k")
        if self.moe_top_k > self.num_experts:
            raise FieldValueError("moe_top_k", f"moe_top_k ({self.moe_top_k}) cannot exceed num_experts "
                             f"({self.num_experts})")
        if self.shared_expert_ffn_hidden_size is not None and not self.num_shared_experts:
            raise FieldValueError("shared_expert_ffn_hidden_size",
                                  "shared_expert_ffn_hidden_size needs num_shared_experts >= 1")
        if self.num_moe_layers == 0:
            raise FieldValueError("first_k_dense_layers", f"no layer is MoE: first_k_dense_layers "
                                  f"({self.first_k_dense_layers}) "
                             f"and moe_layer_freq ({self.moe_layer_freq}) leave all "
                             f"{self.num_layers} layers dense")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        """Width of Q and of the output projection's input: heads x head_dim (= hidden_size
        unless head_dim is given)."""
        return self.num_attention_heads * self.head_dim

    # -- Mixture of Experts ----------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) has the routed MLP (field comments above)."""
        return (self.is_moe and index >= self.first_k_dense_layers
                and index % self.moe_layer_freq == 0)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def moe_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size

    @property
    def shared_ffn_size(self) -> int:
        """The shared experts' summed MLP width (0 without shared experts)."""
        if not self.num_shared_experts:
            return 0
        return self.shared_expert_ffn_hidden_size or self.moe_ffn_size * self.num_shared_experts

    def to_mapping(self) -> dict:
        """The model mapping of DESIGN §2 as written into plans (shape defaults made explicit;
        architecture fields only where they depart from GPT style)."""
        mapping = {
            "name": self.name, "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads, "num_kv_heads": self.kv_heads,
            "ffn_hidden_size": self.ffn_size, "mlp": self.mlp, "vocab_size": self.vocab_size,
            "tied_embeddings": self.tied_embeddings,
        }
        for name, gpt_value in _GPT_STYLE.items():
            if getattr(self, name) != gpt_value:
                mapping[name] = getattr(self, name)
        # only where given: dense models' plans and profile keys read as before these existed
        if self.attention_head_dim is not None:
            mapping["head_dim"] = self.attention_head_dim
        if self.is_moe:
            mapping.update(num_experts=self.num_experts, moe_top_k=self.moe_top_k,
                           moe_ffn_hidden_size=self.moe_ffn_size)
            if self.num_shared_experts:
                mapping.update(num_shared_experts=self.num_shared_experts,
                               shared_expert_ffn_hidden_size=self.shared_ffn_size)
            if self.first_k_dense_layers:
                mapping["first_k_dense_layers"] = self.first_k_dense_layers
            if self.moe_layer_freq != 1:
                mapping["moe_layer_freq"] = self.moe_layer_freq
        return mapping
