"""Measured per-layer costs (DESIGN §1: profile).

Reading profiles (``ProfileSet``, ``load_profiles``) needs no torch; measuring them
(``planner.profile.measure``) imports torch and is loaded only by ``planner profile``.
"""

from planner.profile.schema import LAYER_KINDS, SCHEMA_ID, ProfileEntry, ProfileFile
from planner.profile.store import ProfileSet, gpu_type_for_device, load_profiles

__all__ = ["LAYER_KINDS", "SCHEMA_ID", "ProfileEntry", "ProfileFile", "ProfileSet",
           "gpu_type_for_device", "load_profiles"]
