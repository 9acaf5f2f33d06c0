"""Ctrl-C during a MILP solve stops the search at once (highspy swallows a KeyboardInterrupt
raised inside its callbacks: the CLI ran on to its time limit, wrote the plan and exited 0)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from planner.cost import topology_for
from planner.search.classes import class_infos
from planner.search.core.milp import CoreMilp, MilpSettings
from planner.search.knobs import Knobs, make_context
from planner.search.space import Pricer
from planner.spec import Training, load_cluster, load_model

SPECS = Path(__file__).parent.parent / "cluster_specs"


def _hard_problem():
    """A three-zone tuple whose MILP takes about ten seconds."""
    cluster = load_cluster(SPECS / "three-zone.yaml")
    model, training = load_model("llama3-8b"), Training(global_batch_size=256, seq_len=4096)
    topo = topology_for(cluster)
    pricer = Pricer(model, training, class_infos(topo, training.precision), topo)
    knobs = Knobs(16, 16, "1f1b", 1, "selective", 1, 4)
    return pricer.price(knobs, make_context(model, training, knobs))


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_ctrl_c_interrupts_a_milp_solve_at_once():
    milp = CoreMilp(_hard_problem())
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            milp.solve(MilpSettings(time_limit_s=60))
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 5.0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
