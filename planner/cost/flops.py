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
- Heads wider than h / a (Qwen3): Q and the output projection are ``a d`` wide, ``q_width``.
- Mixture of Experts (Fedus et al. 2022, Switch Transformer; Jiang et al. 2024, Mixtral): a MoE
  layer's MLP is a router GEMM ``2 T h E`` and, per token, its ``top_k`` routed expert MLPs of
  width ``f_e`` plus the shared experts (one MLP of their summed width ``f_sh``):
  ``2 * matrices * T h (top_k f_e + f_sh)``; its weights hold all ``E`` experts.  FLOPs count
  the active experts only, so MFU counts active parameters.  A model whose dense and MoE layers
  mix (DeepSeek-V3's 3 dense first) is priced per block as its *average* block (``moe_fraction``
  of the MoE block, the rest of the dense one): whole-model FLOPs and parameters are exact, a
  stage holding the dense layers is priced at the average (docs/internals.md).
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
    mlp_flops: float          # gelu: 2 * 2 b s h f; swiglu: 3 * 2 b s h f (MoE: module docstring)
    router_flops: float = 0.0  # MoE: 2 b s h E

    @property
    def total_flops(self) -> float:
        return (self.qkv_flops + self.attention_flops + self.out_proj_flops + self.mlp_flops
                + self.router_flops)

    @property
    def dense_flops(self) -> float:
        """The weight matmuls (everything but the s^2 attention terms)."""
        return self.qkv_flops + self.out_proj_flops + self.mlp_flops + self.router_flops


def kv_width(model: ModelSpec) -> int:
    """h_kv: width of the K (or V) projection, kv_heads * head_dim."""
    return model.kv_heads * model.head_dim


def mlp_matrices(model: ModelSpec) -> int:
    """GeLU MLP: up and down projections (2); SwiGLU: gate, up and down (3)."""
    return 3 if model.mlp == "swiglu" else 2


def moe_fraction(model: ModelSpec) -> float:
    """Share of the layers with the routed MLP: 0 for dense models, 1 when every layer is MoE."""
    return model.num_moe_layers / model.num_layers if model.is_moe else 0.0


def moe_active_ffn(model: ModelSpec) -> int:
    """MLP width a token goes through in a MoE layer: top_k routed experts + the shared ones."""
    return (model.moe_top_k or 0) * model.moe_ffn_size + model.shared_ffn_size


def block_forward_flops(model: ModelSpec, b: float, s: int) -> BlockFlops:
    """Narayanan et al. SC21 (App. A) generalised to GQA, SwiGLU, wide heads and MoE (the
    average block of a model mixing dense and MoE layers, module docstring)."""
    h, f, q = model.hidden_size, model.ffn_size, model.q_width
    tokens = b * s
    mlp = 2 * mlp_matrices(model) * tokens * h * f
    router = 0.0
    frac = moe_fraction(model)
    if frac:
        moe_mlp = 2 * mlp_matrices(model) * tokens * h * moe_active_ffn(model)
        mlp = frac * moe_mlp + (1 - frac) * mlp
        router = frac * 2 * tokens * h * model.num_experts
    return BlockFlops(
        qkv_flops=2 * tokens * h * (q + 2 * kv_width(model)),
        attention_flops=2 * 2 * b * s * s * q,
        out_proj_flops=2 * tokens * q * h,
        mlp_flops=mlp,
        router_flops=router,
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

def _dense_block_params(model: ModelSpec) -> int:
    h, f, q = model.hidden_size, model.ffn_size, model.q_width
    hk = kv_width(model)
    attention = h * (q + 2 * hk) + q * h
    mlp = mlp_matrices(model) * h * f
    norms = 2 * 2 * h  # two LayerNorms, scale + bias
    biases = (q + 2 * hk) + h + f * (mlp_matrices(model) - 1) + h if model.mlp == "gelu" else 0
    return attention + mlp + norms + biases


def moe_block_params(model: ModelSpec) -> tuple[int, int]:
    """(expert weights, everything else) of one MoE block: the E routed experts' MLPs (what
    expert parallelism splits), and attention, norms, router (h x E) and shared experts."""
    h = model.hidden_size
    dense = _dense_block_params(model)
    dense_mlp = mlp_matrices(model) * h * model.ffn_size
    experts = model.num_experts * mlp_matrices(model) * h * model.moe_ffn_size
    rest = dense - dense_mlp + h * model.num_experts + mlp_matrices(model) * h * model.shared_ffn_size
    return experts, rest


def block_expert_params(model: ModelSpec) -> float:
    """Routed-expert weights of the average block (0 for dense models): the part of
    ``block_params`` that expert parallelism divides by ep."""
    if not model.is_moe:
        return 0.0
    return moe_block_params(model)[0] * moe_fraction(model)


def block_params(model: ModelSpec) -> float:
    """Weights of one block: Q, K, V, O projections (+ biases for GeLU/GPT models), MLP, 2 norms;
    a MoE block all its experts and the router; a model mixing dense and MoE layers its average
    block (an int for dense models and all-MoE ones)."""
    dense = _dense_block_params(model)
    if not model.is_moe:
        return dense
    moe = sum(moe_block_params(model))
    n_moe = model.num_moe_layers
    if n_moe == model.num_layers:
        return moe
    return (n_moe * moe + (model.num_layers - n_moe) * dense) / model.num_layers


def active_params(model: ModelSpec) -> float:
    """Parameters one token goes through: all but the routed experts it is not sent to."""
    if not model.is_moe:
        return float(total_params(model))
    idle = model.num_moe_layers * (model.num_experts - model.moe_top_k) * mlp_matrices(model) \
        * model.hidden_size * model.moe_ffn_size
    return float(total_params(model) - idle)


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
    blocks = model.num_layers * block_params(model)
    if model.is_moe:   # exact whole count, not L x the average block's float
        blocks = (model.num_moe_layers * sum(moe_block_params(model))
                  + (model.num_layers - model.num_moe_layers) * _dense_block_params(model))
    return (blocks + embedding_params(model)
            + head_params(model, with_embedding_on_same_stage=True))
