"""The one entry file of every Python the runbook starts on a host (rbrules.launch):

    python -I -S -B KIT/rbrules/start.py MODULE ARGS...

runs MODULE as `python -m MODULE ARGS...` would, with KIT (this file's grandparent) first on
sys.path and nothing from the working directory or the environment: under -I neither the
working directory nor this file's directory is on sys.path, so the only place a kit module can
come from is the private directory this file lies in. Nothing here imports before sys.path is set.
"""

import os
import runpy
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -I -S -B KIT/rbrules/start.py MODULE [ARGS...]")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
