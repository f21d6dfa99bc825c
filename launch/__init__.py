"""Launchers: local multi-process runs and job scripts for SLURM and LSF systems."""
