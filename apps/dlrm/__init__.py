"""DLRM on TorchRec: sharded embedding tables, every collective through the mcr runtime."""
