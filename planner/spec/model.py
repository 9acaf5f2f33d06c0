"""The transformer to train (DESIGN §2: Model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.spec.quantities import PositiveInt

# The GPT-style architecture (Megatron-LM's defaults): learned absolute positions, LayerNorm,
# biased linear layers. Fields at these values are left out of to_mapping so that plans and
# profiles of GPT-style models read as they did before the fields existed.
_GPT_STYLE = {"position_embedding": "learned", "normalization": "layernorm", "linear_bias": True,
              "rotary_base": None, "rope_scaling_factor": None}


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer: ``embedding, block_0 … block_{L-1}, head``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    source: str | None = None
    aliases: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check_shape(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must divide "
                             f"hidden_size ({self.hidden_size})")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"num_kv_heads ({self.kv_heads}) must divide num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.position_embedding != "rope":
            for name in ("rotary_base", "rope_scaling_factor"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} applies to position_embedding: rope only "
                                     f"(this model has {self.position_embedding})")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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
        return mapping
