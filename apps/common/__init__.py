"""What the trainers share: config loading, comm setup, data, metrics, checkpoints."""
