"""DeepSpeed-MoE trainer: a GPT with expert-parallel MoE layers (see train.py)."""
