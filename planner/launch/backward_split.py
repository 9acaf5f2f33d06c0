"""A stage chunk's backward cut into its input-gradient part (I) and weight-gradient part (W).

Zero-bubble schedules (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2) run the backward
of a micro-batch in two actions: I computes the gradient the previous stage waits for, W the
weight gradients nobody waits for, later.  Done by hand on the autograd graph of one forward:

- The graph from the chunk's output down to its input ``x_in`` is walked once.  A *boundary*
  node is one on a path to ``x_in`` with an edge into a part that leads only to weights (a
  matmul whose other operand is ``W.T``, a layer norm with its affine parameters).
- I: ``torch.autograd.grad(out, x_in, retain_graph=True)``.  The engine computes only what the
  input gradient needs (a node skips outputs whose edges lead nowhere requested), so the weight
  halves of the boundary nodes are not run; a pre-hook on each boundary node keeps the
  gradient flowing into it, and ``retain_graph`` keeps its saved tensors.
- W: one ``torch.autograd.grad`` that starts at the boundary nodes (``GradientEdge``) with those
  kept gradients and asks for the weights: the boundary nodes now run their weight halves only,
  then the weight-only nodes below them (transposes, slices) down to the leaves.

So I + W do the work of one full backward (B) and give the same numbers; nothing is recomputed.
Collectives inside the backward (the tp all-reduce of ``_CopyToTP``) lie on the input path and
run in I, in the same order on every tp rank; W runs none.  A chunk without ``x_in`` (the one
holding the embedding) has no input gradient: its I does nothing and W is its full backward.
"""

from __future__ import annotations

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge


def _children(node) -> list:
    return [n for n, _ in node.next_functions if n is not None]


def _post_order(root) -> list:
    """Every node below ``root`` once, each after all of its children (iterative: graphs of a
    few blocks are already thousands of nodes deep in places)."""
    order, seen, stack = [], {root}, [(root, iter(_children(root)))]
    while stack:
        node, kids = stack[-1]
        for child in kids:
            if child not in seen:
                seen.add(child)
                stack.append((child, iter(_children(child))))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def _reaching(root, target) -> dict:
    """node -> whether it leads to ``target``, for every node under ``root``."""
    reaches: dict = {}
    for node in _post_order(root):
        reaches[node] = node is target or any(reaches[c] for c in _children(node))
    return reaches


def weight_edges(root, target) -> dict | None:
    """Boundary node -> its edges ``(node, input_nr)`` into weight-only sub-graphs, for the nodes
    under ``root`` that lead to ``target`` and also branch off to parts that do not (a matmul
    whose other operand is ``W.T``, a layer norm with its affine parameters).  None when two
    boundary nodes reach the same weight-only node (a weight used twice in the chunk): then
    the weight halves cannot be run one boundary node at a time without double counting."""
    reaches = _reaching(root, target)
    out, owner = {}, {}
    for node, leads in reaches.items():
        if not leads:
            continue
        edges = [(c, nr) for c, nr in node.next_functions if c is not None and not reaches[c]]
        if not edges:
            continue
        out[node] = edges
        for below in _post_order_many([c for c, _ in edges]):
            if owner.setdefault(below, node) is not node:
                return None
    return out


def _post_order_many(roots: list) -> list:
    seen, order = set(), []
    for r in roots:
        if r not in seen:
            for n in _post_order(r):
                if n not in seen:
                    seen.add(n)
                    order.append(n)
    return order


class SplitBackward:
    """The backward of one (chunk, micro-batch): ``input_grad()`` once (I), then
    ``weight_grads(params)`` once (W).  ``grad_out`` is None for a scalar loss."""

    def __init__(self, out: torch.Tensor, x_in: torch.Tensor | None, grad_out: torch.Tensor | None):
        self.out, self.x_in, self.grad_out = out, x_in, grad_out
        self.kept: dict = {}  # boundary node -> the gradients flowing into it during I
        self.edges: dict = {}  # boundary node -> its edges into weight-only sub-graphs
        self.early: dict | None = None  # weight grads computed in I (the fallback below)

    def input_grad(self) -> torch.Tensor | None:
        """The gradient w.r.t. ``x_in`` (None when the chunk has no input)."""
        if self.x_in is None:
            return None
        if self.out is self.x_in:  # a pass-through chunk
            return self.grad_out
        target = get_gradient_edge(self.x_in).node
        edges = weight_edges(self.out.grad_fn, target)
        if edges is None:
            # A weight shared between two branches of the input path: run the whole backward
            # now and hand the weight gradients out at W (same numbers, no deferred work).
            leaves = [p for p in _leaves(self.out.grad_fn) if p is not self.x_in]
            grads = torch.autograd.grad(self.out, [self.x_in, *leaves], self.grad_out, allow_unused=True)
            self.early = {id(p): g for p, g in zip(leaves, grads[1:])}
            return grads[0]
        self.edges = edges
        handles = []
        for node in edges:
            def keep(grad_outputs, node=node):
                self.kept[node] = grad_outputs
            handles.append(node.register_prehook(keep))
        try:
            (g,) = torch.autograd.grad(self.out, self.x_in, self.grad_out, retain_graph=True)
        finally:
            for h in handles:
                h.remove()
        return g

    def weight_grads(self, params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Gradients of ``params`` (None for one this chunk does not use); frees the graph."""
        if self.early is not None:
            found = self.early
        elif self.x_in is None:
            found = {}
            if params and self.out.grad_fn is not None:  # no input: W is the whole backward
                grads = torch.autograd.grad(self.out, params, self.grad_out, allow_unused=True)
                found = {id(p): g for p, g in zip(params, grads)}
        else:
            found = self._deferred()
        self.kept, self.edges, self.early = {}, {}, None
        self.out = self.x_in = self.grad_out = None
        return [found.get(id(p)) for p in params]

    def _deferred(self) -> dict:
        """W proper.  First each boundary node's weight half alone: one engine call per node
        from the kept gradient to its weight-only edges (a call with several roots would also
        walk the input path from one boundary node down to the next and count it twice).  Then
        one call from all those edges to the leaves below them."""
        roots, root_grads, found = [], [], {}
        for node, edges in self.edges.items():
            grad_outputs = self.kept.get(node)
            if grad_outputs is None:
                continue
            outs = [(GradientEdge(node, i), g) for i, g in enumerate(grad_outputs) if g is not None]
            if not outs:
                continue
            got = torch.autograd.grad([o for o, _ in outs], [GradientEdge(c, nr) for c, nr in edges],
                                      [g for _, g in outs], allow_unused=True)
            for (child, nr), g in zip(edges, got):
                if g is None:
                    continue
                if hasattr(child, "variable"):  # the edge is a leaf's accumulator: its gradient
                    found[id(child.variable)] = _add(found.get(id(child.variable)), g)
                else:
                    roots.append(GradientEdge(child, nr))
                    root_grads.append(g)
        if roots:
            leaves = _leaves_many([r.node for r in roots])
            grads = torch.autograd.grad(roots, leaves, root_grads, allow_unused=True)
            for p, g in zip(leaves, grads):
                if g is not None:
                    found[id(p)] = _add(found.get(id(p)), g)
        return found


def _add(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a + b


def _leaves(root) -> list[torch.Tensor]:
    return _leaves_many([root])


def _leaves_many(roots: list) -> list[torch.Tensor]:
    """The tensors whose accumulators lie under ``roots`` (the weights they lead to)."""
    return [n.variable for n in _post_order_many(roots) if hasattr(n, "variable")]
