"""Speculative decoding: acceptance rules shared by self-speculation (NLD §3.3, App. C) and DEER (arXiv:2512.15176 §3.3)."""
from .accept import AcceptResult, greedy_accept, speculative_accept

__all__ = ["AcceptResult", "greedy_accept", "speculative_accept"]
