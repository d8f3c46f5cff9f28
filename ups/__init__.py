"""ups: a containerized PyTorch DDP job runner for PDE surrogate models."""

__version__ = "0.1.0"
