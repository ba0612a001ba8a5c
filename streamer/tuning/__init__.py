"""The tuning monitor and the tuner: f5c's decision trees (paper 4.3.4, Fig. 9) over each batch's GPU
ABEA measurements, acted on within safe bounds, with device profiles and learned values per GPU.

`monitor` (the trees, pure), `controller` (the state machine that acts, pure), `profiles`
(device profiles and the start-up plan, pure), `store` (learned values on disk), and
`streamer.tuning.session` (the edges: the GPU probe, logging, publishing, applying changes),
which commands import themselves.
"""

from __future__ import annotations

from streamer.tuning.controller import Controller
from streamer.tuning.knobs import Action, Bounds, Change, Policy, Settings
from streamer.tuning.monitor import Decision, Guard, LoadLeaf, Measurements, MemoryLeaf, Monitor
from streamer.tuning.profiles import PROFILE_NAMES, PROFILES, Machine, Plan, Profile, pick_profile, plan, user_set
from streamer.tuning.store import TuningStore

__all__ = ["PROFILES", "PROFILE_NAMES", "Action", "Bounds", "Change", "Controller", "Decision", "Guard", "LoadLeaf",
           "Machine", "Measurements", "MemoryLeaf", "Monitor", "Plan", "Policy", "Profile", "Settings", "TuningStore",
           "pick_profile", "plan", "user_set"]
