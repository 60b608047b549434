import sys

if sys.argv[1:2] == ["report"]:
    # the run's report and its pictures (a runbook's end: rb::report), on this machine only
    from .runreport import main as report_main

    sys.exit(report_main(sys.argv[2:]))

from .draw import main

sys.exit(main())
