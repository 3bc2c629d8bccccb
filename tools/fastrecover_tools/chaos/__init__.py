"""The fault campaign: a sequenced producer, a kill/restart driver and a checker that proves nothing is lost.

* :mod:`fastrecover_tools.chaos.producer`: writes a known sequence at a steady rate
  and logs every acknowledged record;
* :mod:`fastrecover_tools.chaos.driver`: runs consumer worker processes
  (:mod:`fastrecover_tools.testing.worker`) in parallel-rebalance mode, SIGKILLs them at
  random moments or at chosen stall points, restarts them, and drains at the end;
* :mod:`fastrecover_tools.chaos.checker`: pure analysis of the producer log, the
  topic, the consumers' ledger and the range store: records lost (must be 0),
  duplicates, waits, time to fresh data, ranges and fencing;
* :mod:`fastrecover_tools.chaos.report`: the checker's verdict as a table.

``fastrecover chaos`` runs the whole campaign from the command line.
"""

from fastrecover_tools.chaos.checker import Verdict, analyze

__all__ = ["Verdict", "analyze"]
