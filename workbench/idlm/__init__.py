"""I-DLM (arXiv:2604.11035): introspective strided decoding (ISD, §3.2, Algorithm 1) of a model
trained with the I-DLM objective (``workbench train lm --objective idlm``, §3.1), lossless R-ISD with a gated
LoRA (App. G), and the theoretical TPF of Eq. 3."""
from .isd import isd_decode, isd_tpf

__all__ = ["isd_decode", "isd_tpf"]
