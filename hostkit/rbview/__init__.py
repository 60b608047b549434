"""rbview: the pictures of a run, drawn on the machine that runs the runbook only (never shipped to
a host): timeline.svg, nodes.svg (fan-out) and report.html beside report.json.

`draw.write_all(report, events_path, out_dir, fanout=None)` draws
- timeline.svg (`timeline`): one row per step, grouped in one band per host, on a time axis in
  seconds (from the step lines of the event log), each host's checks under its band, and the
  transfer rate over time (from `progress` lines when the log has them, else the transfer's
  average rate);
- nodes.svg (`nodes`), for a fan-out: nodes x steps and checks, a cell per status with its
  seconds, odd and missing nodes named;
- report.html (`page`): the pictures, the steps, each host's checks, the fan-out comparison.
`svg` holds what they share: colours, the one escaper, text fitted to a width, the Svg writer.

Event log lines read here (tab-separated; `rbkit.report.read_events` reads the first two):
    step STEP STATUS START_MS END_MS HOST DETAIL
    fact STEP KEY VALUE
    progress STEP HOST T_MS BYTES        (optional: BYTES of the stream STEP moved so far, at T_MS,
                                          same clock; the transfer's: what the destination's tar
                                          read)

The SVG is written by hand: no plotting library. The output depends only on its inputs (no clock,
stable order), so the same run gives the same bytes; every text from the run (hosts, details,
reasons) is escaped.

`python -m rbview --report R --events E --out DIR [--fanout F]` writes them from files (F: the
fan-out's fanout.json; the node-*.json beside it give the seconds per cell). `rbkit report
--pictures DIR` draws them in its own process at the end of every run.

It is part of the pinned kit, which the runbook extracts here, and left out of the tar sent to the
hosts (compiler.kit.CONTROLLER_PACKAGES). stdlib only (and rbkit.fanout.fold); Python >= 3.9.
"""
