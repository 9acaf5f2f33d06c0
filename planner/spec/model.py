"""The transformer to train (DESIGN §2: Model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.spec.quantities import PositiveInt


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
        """The model mapping of DESIGN §2 as written into plans (defaults made explicit)."""
        return {
            "name": self.name, "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads, "num_kv_heads": self.kv_heads,
            "ffn_hidden_size": self.ffn_size, "mlp": self.mlp, "vocab_size": self.vocab_size,
            "tied_embeddings": self.tied_embeddings,
        }
