"""FLOPs and parameter counts of the layers of a decoder-only transformer.

Layer sequence (DESIGN §2): ``embedding, block_0 … block_{L-1}, head``.  All counts are for
the whole layer (before tensor-parallel sharding) and one forward pass over ``b`` sequences of
``s`` tokens; one multiply-add is 2 FLOPs.

Sources:
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC21, §5.1 / Appendix: per block forward ``24 b s h^2 + 4 b s^2 h`` for MHA,
  a 4h GeLU MLP; backward = 2x forward; the logits layer ``2 b s h V`` forward.
- Grouped-query attention (Ainslie et al. 2023): K and V project to ``kv_heads * head_dim``.
- SwiGLU MLP (Shazeer 2020, as in LLaMA): three ``h x f`` matrices instead of two.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.spec.model import ModelSpec

# Backward pass = gradient w.r.t. inputs + w.r.t. weights: 2x the forward matmul FLOPs
# (Narayanan et al. SC21, §5.1).
BACKWARD_FLOPS_FACTOR = 2.0


@dataclass(frozen=True)
class BlockFlops:
    """Forward FLOPs of one transformer block, by matmul (whole layer, not per TP shard)."""

    qkv_flops: float          # 2 b s h (h + 2 h_kv)
    attention_flops: float    # Q K^T and attention x V: 2 * 2 b s^2 h
    out_proj_flops: float     # 2 b s h^2
    mlp_flops: float          # gelu: 2 * 2 b s h f; swiglu: 3 * 2 b s h f

    @property
    def total_flops(self) -> float:
        return self.qkv_flops + self.attention_flops + self.out_proj_flops + self.mlp_flops

    @property
    def dense_flops(self) -> float:
        """The weight matmuls (everything but the s^2 attention terms)."""
        return self.qkv_flops + self.out_proj_flops + self.mlp_flops


def kv_width(model: ModelSpec) -> int:
    """h_kv: width of the K (or V) projection, kv_heads * head_dim."""
    return model.kv_heads * model.head_dim


def mlp_matrices(model: ModelSpec) -> int:
    """GeLU MLP: up and down projections (2); SwiGLU: gate, up and down (3)."""
    return 3 if model.mlp == "swiglu" else 2


def block_forward_flops(model: ModelSpec, b: float, s: int) -> BlockFlops:
    """Narayanan et al. SC21 (App. A) generalised to GQA and SwiGLU."""
    h, f = model.hidden_size, model.ffn_size
    tokens = b * s
    return BlockFlops(
        qkv_flops=2 * tokens * h * (h + 2 * kv_width(model)),
        attention_flops=2 * 2 * b * s * s * h,
        out_proj_flops=2 * tokens * h * h,
        mlp_flops=2 * mlp_matrices(model) * tokens * h * f,
    )


def head_forward_flops(model: ModelSpec, b: float, s: int) -> float:
    """Output projection to the vocabulary: 2 b s h V (Narayanan et al. SC21, §5.1)."""
    return 2 * b * s * model.hidden_size * model.vocab_size


def embedding_forward_flops(model: ModelSpec, b: float, s: int) -> float:
    """A table look-up: no matmul FLOPs (its cost is memory traffic, see compute.py)."""
    return 0.0


def model_forward_flops(model: ModelSpec, b: float, s: int) -> float:
    """Forward FLOPs of the whole model for ``b`` sequences."""
    return (model.num_layers * block_forward_flops(model, b, s).total_flops
            + head_forward_flops(model, b, s))


def model_flops_per_iteration(model: ModelSpec, global_batch_size: int, s: int) -> float:
    """Model FLOPs of one iteration, forward + backward, no recompute (the MFU numerator).

    = 3 x forward (Narayanan et al. SC21 eq. (3) without the recompute forward); for a GPT
    this is ``72 B s L h^2 (1 + s/6h + V/12hL)``.
    """
    return (1 + BACKWARD_FLOPS_FACTOR) * model_forward_flops(model, global_batch_size, s)


# -- parameters -----------------------------------------------------------------------------

def block_params(model: ModelSpec) -> int:
    """Weights of one block: Q, K, V, O projections (+ biases for GeLU/GPT models), MLP, 2 norms."""
    h, f = model.hidden_size, model.ffn_size
    hk = kv_width(model)
    attention = h * (h + 2 * hk) + h * h
    mlp = mlp_matrices(model) * h * f
    norms = 2 * 2 * h  # two LayerNorms, scale + bias
    biases = (h + 2 * hk) + h + f * (mlp_matrices(model) - 1) + h if model.mlp == "gelu" else 0
    return attention + mlp + norms + biases


def embedding_params(model: ModelSpec) -> int:
    """Token embedding table V x h (position embeddings, if any, are not counted)."""
    return model.vocab_size * model.hidden_size


def head_params(model: ModelSpec, with_embedding_on_same_stage: bool = False) -> int:
    """Final norm + output projection; a tied output projection on the embedding's stage is shared."""
    h = model.hidden_size
    if model.tied_embeddings and with_embedding_on_same_stage:
        return 2 * h
    return model.vocab_size * h + 2 * h


def total_params(model: ModelSpec) -> int:
    return (model.num_layers * block_params(model) + embedding_params(model)
            + head_params(model, with_embedding_on_same_stage=True))
