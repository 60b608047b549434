"""The install engine's rules the runbook states too: its steps in order, how long the staged
interpreter has to answer, how long a second run waits for the destination's lock.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

# the install engine's steps, in order: a single-host runbook runs them one by one on the
# destination, a fan-out node all in one process
ENGINE_STEPS = ("stage", "receive", "verify", "relocate", "prove", "swap", "exports", "probe")


PROVE_TIMEOUT = 120  # seconds for the staged (and the installed) interpreter to answer
# seconds a second run waits for the lock a first run holds on a destination, whoever takes it: the
# single-host engine (serve/run, and the runbook's RB_LOCK_WAIT default) and a fan-out node alike.
# A wait is for a run that is ending, which takes as long whatever route took the lock.
LOCK_WAIT_S = 30
