"""A stage option's times as lines in its block count (``OptionLines``, a base of
``space.Pricer``): forward and backward per kind of replica, the backward's weight-gradient
part, the optimizer step and the gradient sync (HSDP's and MoE's included), each a slope per
unit of blocks and one intercept per stage position (``POSITIONS``: the embedding and the head
add theirs), cached per (context knobs, class, tp, share, unit) so that the knob tuples of one
search share them; a mixed stage's stand-in reads the least of its two kinds."""

from __future__ import annotations

import numpy as np

from planner.cost import dp_sync_time_s, optimizer_time_s, replica_compute, stage_params
from planner.cost.compute import backward_weight_s
from planner.cost.hsdp import hsdp_option_sync, is_hsdp
from planner.cost.moe import ep_sync_s, expert_params, optimizer_params, option_ep_comm
from planner.search.knobs import OptionKey
from planner.search.mixed import StandIn
from planner.search.pieces import shares
from planner.search.schedules import SCHEDULES
from planner.search.slots import POSITIONS, Position


class OptionLines:
    """Needs the pricer's ``model``, ``classes``, ``topo``, ``cache_id``, ``ring`` and its caches
    ``_fb``, ``_opt`` and ``_syncs`` (space.Pricer sets them)."""

    def lines(self, ctx, knobs, key: OptionKey, unit: int):
        """Forward/backward and optimizer time as lines in the block count: the middle-stage
        slopes and each position's intercept.  Forward and backward do not read the ZeRO stage,
        the optimizer step neither the recompute nor B (planner.cost.compute): cached apart, so
        the knob tuples of one search share the work.  A mixed stage's stand-in (mixed.py):
        lines at most the stage's (``_stand_in_lines``)."""
        if isinstance(key, StandIn):
            return self._stand_in_lines(ctx, knobs, key, unit)
        share = -(-knobs.micro_batch_size // key.replicas)
        shard = zero_shard(ctx, key)
        sf, sb, fb = self.kind_lines(ctx, key.cls, key.tp, share, unit)
        ef, eb = self.ep_lines(ctx, knobs, key, unit)
        return ((sf + ef, sb + eb, fb) if ef or eb else (sf, sb, fb),
                self.optimizer_lines(ctx, key.cls, key.tp, shard, unit))

    def ep_lines(self, ctx, knobs, key, unit: int) -> tuple[float, float]:
        """(forward, backward) slopes per unit of blocks of an option's all-to-alls (cost/moe.py;
        no intercept: they run per MoE block); 0 without EP."""
        if ctx.expert_parallel <= 1 or not self.model.is_moe or isinstance(key, StandIn):
            return 0.0, 0.0
        ek = ("ep", self.cache_id(ctx), knobs.micro_batch_size, key, unit)
        hit = self._fb.get(ek)
        if hit is None:
            info = self.classes[key.cls]
            hit = self._fb[ek] = option_ep_comm(ctx, self.topo, info.replica_devices(key.tp, key.replicas),
                                                shares(knobs.micro_batch_size, key.replicas), key.tp, unit, info.gpu)
        return hit

    def _stand_in_lines(self, ctx, knobs, key: StandIn, unit: int):
        """A mixed stage runs its slowest kind's forward and backward (by their total), so
        either kind's total is at most the stage's at every block count: where the schedule
        reads only the total (1F1B, interleaved), the lines of the kind slower in the middle of
        the block range; GPipe reads forward and backward apart: their least, quantity by
        quantity.  The optimizer step is the slower kind's: the least of the two is below it."""
        shard = key.replicas if knobs.zero_stage >= 1 else 1
        kinds = key.key.kinds
        fb = [self.kind_lines(ctx, k.cls, k.tp, k.share, unit) for k in kinds]
        opt = [self.optimizer_lines(ctx, k.cls, k.tp, shard, unit) for k in kinds]
        least_opt = (min(opt[0][0], opt[1][0]), np.minimum(opt[0][1], opt[1][1]))
        if SCHEDULES[knobs.schedule].reads_apart:
            return (min(fb[0][0], fb[1][0]), min(fb[0][1], fb[1][1]), np.minimum(fb[0][2], fb[1][2])), least_opt
        mid = max(1, self.model.num_layers // unit // max(1, knobs.num_stages) // 2)
        total = [(f[0] + f[1]) * mid + f[2][Position.MIDDLE].sum() for f in fb]
        return fb[int(total[1] > total[0])], least_opt

    def kind_lines(self, ctx, cls: int, tp: int, share: int, unit: int):
        """(forward slope, backward slope, [positions, 2] intercepts) of a replica of ``tp``
        GPUs of class ``cls`` on ``share`` sequences, per unit of blocks."""
        fk = (ctx.recompute, ctx.context_parallel, ctx.expert_parallel, cls, tp, share, unit)
        fb = self._fb.get(fk)
        if fb is None:
            info = self.classes[cls]
            gpu, intra = info.gpu, info.node_class.intra_Bps
            at = [replica_compute(ctx, gpu, intra, tp, share, unit, emb, head) for emb, head in POSITIONS]
            r2 = replica_compute(ctx, gpu, intra, tp, share, 2 * unit, False, False)
            sf = r2.total_forward_s - at[Position.MIDDLE].total_forward_s
            sb = r2.total_backward_s - at[Position.MIDDLE].total_backward_s
            fb = self._fb[fk] = (sf, sb, np.array([(r.total_forward_s - sf, r.total_backward_s - sb) for r in at]))
        return fb

    def weight_lines(self, ctx, cls: int, tp: int, share: int, unit: int):
        """(slope, [positions] intercepts) of the W part of the backward
        (``compute.backward_weight_s``) of a replica of ``tp`` GPUs of class ``cls`` on
        ``share`` sequences, per unit of blocks."""
        wk = ("w", ctx.recompute, ctx.context_parallel, ctx.expert_parallel, cls, tp, share, unit)
        hit = self._fb.get(wk)
        if hit is None:
            info = self.classes[cls]
            gpu, intra = info.gpu, info.node_class.intra_Bps
            at = np.array([backward_weight_s(ctx, gpu, intra, tp, share, unit, emb, head) for emb, head in POSITIONS])
            slope = backward_weight_s(ctx, gpu, intra, tp, share, 2 * unit) - at[Position.MIDDLE]
            hit = self._fb[wk] = (slope, at - slope)
        return hit

    def input_line(self, ctx, knobs, key, unit: int) -> tuple[float, np.ndarray]:
        """(slope, [positions] intercepts) of the backward's input part I = backward - W, as
        ``lines`` gives forward and backward; a mixed stage's stand-in: the least of its two
        kinds' (at most the stage's, whichever kind is slowest)."""
        if isinstance(key, StandIn):
            lines = [self._input_of(ctx, k.cls, k.tp, k.share, unit) for k in key.key.kinds]
            return min(lines[0][0], lines[1][0]), np.minimum(lines[0][1], lines[1][1])
        slope, icpt = self._input_of(ctx, key.cls, key.tp, -(-knobs.micro_batch_size // key.replicas), unit)
        return slope + self.ep_lines(ctx, knobs, key, unit)[1], icpt   # the all-to-alls are I's

    def _input_of(self, ctx, cls: int, tp: int, share: int, unit: int):
        _, sb, fb = self.kind_lines(ctx, cls, tp, share, unit)
        sw, iw = self.weight_lines(ctx, cls, tp, share, unit)
        _, b_icpt = fb.T
        return sb - sw, b_icpt - iw

    def optimizer_lines(self, ctx, cls: int, tp: int, shard: int, unit: int):
        """(slope, [positions] intercepts) of the optimizer step over a stage's parameters
        sharded ``shard`` ways (ZeRO-1) on ``tp`` GPUs of class ``cls``."""
        ok = (shard, ctx.expert_parallel, cls, tp, unit)
        opt = self._opt.get(ok)
        if opt is None:
            gpu = self.classes[cls].gpu

            def local(nb, emb, head):
                return optimizer_params(ctx, stage_params(ctx, nb, emb, head), _experts(ctx, nb), tp, shard)
            at = [optimizer_time_s(ctx, gpu, local(unit, emb, head)) for emb, head in POSITIONS]
            so = optimizer_time_s(ctx, gpu, local(2 * unit, False, False)) - at[Position.MIDDLE]
            opt = self._opt[ok] = (so, np.array(at) - so)
        return opt

    def sync_lines(self, ctx, key: OptionKey, unit: int) -> tuple[float, np.ndarray]:
        """The stage's gradient sync (``dp_sync_time_s``) as a line in the block count: the
        slope per unit of blocks and each position's intercept (the embedding / head add
        parameters); 0 for one replica."""
        return self._sync_lines(ctx, key, unit)[:2]

    def replicate_lines(self, ctx, key: OptionKey, unit: int) -> tuple[float, np.ndarray]:
        """The HSDP all-reduce part of ``sync_lines`` (cost/hsdp.py), a line the same way;
        0 without HSDP."""
        return self._sync_lines(ctx, key, unit)[2:]

    def _sync_lines(self, ctx, key: OptionKey, unit: int) -> tuple:
        ck = (self.cache_id(ctx), key, unit)
        hit = self._syncs.get(ck)
        if hit is None:
            info = self.classes[key.cls]
            zeros = (0.0, np.zeros(len(POSITIONS)))
            if isinstance(key, StandIn) or key.ranks <= 1:   # a stand-in's sync: 0 (mixed.py)
                hit = zeros + zeros
            else:
                ring = self.ring(key)

                def dp(nb: int, emb: bool, head: bool) -> tuple[float, float]:
                    params = stage_params(ctx, nb, emb, head)
                    if _experts(ctx, nb):     # EP (cp is 1 then): the experts over n/ep (cost/moe.py)
                        first = [d[0] for d in info.replica_devices(key.tp, key.replicas)]
                        return ep_sync_s(ctx, self.topo, first, key.tp, params, _experts(ctx, nb), info.gpu), 0.0
                    if is_hsdp(ctx, key.replicas):
                        hs = self.hsdp(ctx, key, params)
                        return hs.total_s, hs.replicate_s
                    return dp_sync_time_s(ctx, params, key.ranks, key.tp, ring.bandwidth_Bps, ring.latency_s,
                                          ring.kind, info.gpu), 0.0

                one, two = dp(unit, False, False), dp(2 * unit, False, False)
                at = [dp(unit, emb, head) for emb, head in POSITIONS]
                hit = tuple(x for i in (0, 1) for x in (two[i] - one[i], np.array([a[i] - (two[i] - one[i])
                                                                                  for a in at])))
            self._syncs[ck] = hit
        return hit

    def hsdp(self, ctx, key: OptionKey, params: float):
        """The option's HSDP traffic on its representative devices (cost/hsdp.py)."""
        info = self.classes[key.cls]
        return hsdp_option_sync(ctx, self.topo, info.replica_devices(key.width, key.replicas), key.tp,
                                params, info.gpu)


def zero_shard(ctx, key) -> int:
    """Ranks ZeRO shards a stage's state over: its replicas x cp (HSDP: the shard group's)."""
    return ctx.shard_group(key.replicas) * key.cp if ctx.zero_stage >= 1 else 1


def _experts(ctx, blocks: int) -> float:
    """Expert weights of ``blocks`` blocks where EP splits them (0 without EP, as evaluate)."""
    return expert_params(ctx, blocks) if ctx.expert_parallel > 1 and ctx.model.is_moe else 0.0
