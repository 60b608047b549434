import sys

if sys.argv[1:2] == ["report"]:
    # the run's report and its pictures (a runbook's end: rb::report), on this machine only
    from . import runreport

    sys.exit(runreport.main(sys.argv[2:]))

from . import draw

sys.exit(draw.main())
