"""Measured per-layer costs (DESIGN §1: profile).

Reading profiles (``ProfileSet``, ``load_profiles``) and fitting the roofline to them
(``planner.profile.calibrate``) need no torch; measuring them (``planner.profile.measure`` and
its co-tenant helper ``planner.profile.cotenants``) imports torch and is loaded only by
``planner profile``.  docs/profiles.md describes the file format and the lookup rules.
"""

from planner.profile.files import gpu_type_for_device
from planner.profile.schema import LAYER_KINDS, SCHEMA_ID, ProfileEntry, ProfileFile
from planner.profile.store import ProfileSet, load_profiles

__all__ = ["LAYER_KINDS", "SCHEMA_ID", "ProfileEntry", "ProfileFile", "ProfileSet",
           "gpu_type_for_device", "load_profiles"]
