"""ups-preflight: prove a fresh host is fit to train before money is spent."""
