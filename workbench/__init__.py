"""workbench: diffusion-LM samplers and drafter alignment."""
