"""Timing a layer's backward in its two zero-bubble parts: I (gradient with respect to the layer
input, what the previous stage waits on) and W (gradient with respect to the weights, which a
zero-bubble schedule may defer).

The split is run the way torch's pipeline runtime runs it for ``ScheduleInterleavedZeroBubble``
and CSV schedules (torch/distributed/pipelining/stage.py, ``backward_type`` "input" / "weight"):
``stage_backward_input`` computes the input gradient and keeps, for each weight, the gradient
flowing into it; ``stage_backward_weight`` then computes the weight gradients from those.  So the
two times are what a rank spends on an I and on a W action, hooks included; their sum is
usually a little above the fused backward's, which is why the cost model takes only their
ratio from here and applies it to the measured full backward.

Only layers with an input gradient are split (block, head); the embedding's input is token ids,
so its whole backward is W.
"""

from __future__ import annotations

import statistics

import torch

try:  # part of torch.distributed; absent from builds without distributed support
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
except ImportError:  # pragma: no cover - every torch the project tests has it
    stage_backward_input = stage_backward_weight = None


def can_split(case) -> bool:
    return case.leaf is not None and stage_backward_input is not None


def split_backward(case, out) -> list[dict]:
    """Run the I half of one backward (``leaf.grad`` is set); returns what the W half needs."""
    grads = None if case.output_grad is None else [case.output_grad]
    _, groups = stage_backward_input([out], grads, [case.leaf], case.module.parameters())
    return groups


def time_split(case, device, warmup: int, repeats: int, clock, zero,
               statistic=statistics.median) -> tuple[float, float]:
    """(backward_input_s, backward_weight_s): ``statistic`` over ``repeats`` timed passes after
    ``warmup`` untimed ones; CUDA events on GPU, ``clock`` on CPU (as ``measure._time``)."""
    i_times, w_times = [], []
    for n in range(warmup + repeats):
        zero(case)
        out = case.forward()
        if device.type == "cuda":
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            groups = split_backward(case, out)
            mid.record()
            stage_backward_weight(case.module.parameters(), groups)
            end.record()
            torch.cuda.synchronize(device)
            i_s, w_s = start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3
        else:
            t0 = clock()
            groups = split_backward(case, out)
            t1 = clock()
            stage_backward_weight(case.module.parameters(), groups)
            t2 = clock()
            i_s, w_s = t1 - t0, t2 - t1
        del out, groups
        if n >= warmup:
            i_times.append(i_s)
            w_times.append(w_s)
    return statistic(i_times), statistic(w_times)
