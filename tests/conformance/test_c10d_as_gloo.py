"""torch's c10d suite on backend "mcr", the tests it keeps for gloo alone (see suite.py)."""

from tests.conformance.suite import case_class

TestC10dAsGloo = case_class(__name__, "gloo", only_where_skipped_as=("mcr",))
