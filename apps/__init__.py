"""Reference trainers on the mcr runtime: `python -m apps.<name> --config configs/<name>/<preset>.yaml`."""
