"""Shared test setup.

The machine has two cores shared by everything, so torch uses one thread. Under CI
(``CI`` set, as ``.ci/run`` runs) hypothesis draws the same examples every run, so a
submission's result does not depend on luck; locally it explores afresh each run.
"""

import os

import torch
from hypothesis import settings

torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
