"""The Megatron-style dense GPT trainer: tensor, pipeline and data parallel on the mcr runtime."""
