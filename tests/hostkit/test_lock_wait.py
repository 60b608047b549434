"""How long a second run waits for a destination's lock is one rule
(rbrules.enginerules.LOCK_WAIT_S): the single-host engine (`rbkit serve`/`run`), a fan-out node
and the runbook's RB_LOCK_WAIT default all take it from there. Before, serve waited 30 s and a
fan-out node 10 s, for no reason either side stated (this test failed there).
"""

from __future__ import annotations

import re
from pathlib import Path

from rbkit import fanout, serve
from rbrules import enginerules

ROOT = Path(__file__).resolve().parents[2]


def test_every_lock_wait_is_the_shared_rule():
    assert serve.LOCK_WAIT_S == enginerules.LOCK_WAIT_S
    assert fanout.LOCK_WAIT_S == enginerules.LOCK_WAIT_S
    p = serve.argparse.ArgumentParser()
    serve._choices(p)
    assert p.get_default("lock_wait") == enginerules.LOCK_WAIT_S


def test_the_runbook_default_is_the_shared_rule():
    # the runtime's default (runtime.sh of the kit every runbook pins)
    text = (ROOT / "tests" / "cases" / "runtime.sh").read_text()
    assert re.findall(r"^RB_LOCK_WAIT=\$\{RB_LOCK_WAIT:-(\d+)\}$", text, re.M) == [
        str(enginerules.LOCK_WAIT_S)
    ]
