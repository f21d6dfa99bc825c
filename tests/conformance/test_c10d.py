"""torch's c10d suite on backend "mcr" (see suite.py): the tests it keeps for "mcr"'s features."""

from tests.conformance.suite import case_class

TestC10dAsMcr = case_class(__name__, "mcr")
