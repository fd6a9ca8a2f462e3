"""LoRA drafter alignment for linear self-speculation (NLD §3.3, Eq. 6–9): LK-hybrid + CE losses,
peft LoRA on the diffusion pathway's ``o_proj``, Lightning training, and evaluation."""
