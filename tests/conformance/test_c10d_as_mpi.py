"""torch's c10d suite on backend "mcr", the tests it keeps for MPI alone (see suite.py)."""

from tests.conformance.suite import case_class

TestC10dAsMpi = case_class(__name__, "mpi", only_where_skipped_as=("mcr", "gloo"))
