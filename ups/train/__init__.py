"""The ups trainer: one torchrun worker (``ups-train CONFIG``)."""
