"""Shared test setup: the machine has two cores shared by everything, so one thread each."""

import torch

torch.set_num_threads(1)
