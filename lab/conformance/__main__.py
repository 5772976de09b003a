"""``python -m lab.conformance``: the ``conformance`` command (:mod:`lab.conformance.cli`)."""

from lab.conformance.cli import main

main()
