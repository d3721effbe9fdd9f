"""`lnk sandbox check`: probes run inside a sandbox against bait set up outside.

`command` (the command), `bait` (set up and removed outside), `plan` (what is tried and what it
should come to), `launch` (the controller's check launch), `verdicts` (pure), `report` (human
and JSON output). What runs inside the sandbox, the probe program, is not here but in its own
room, `lnk_inside.probes` (sandbox/), which imports nothing of the box.
"""
