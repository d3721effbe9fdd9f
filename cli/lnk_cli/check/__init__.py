"""`lnk sandbox check`: probes run inside a sandbox against bait set up outside.

`command` (the command), `bait` (set up and removed outside), `plan` (what is tried and what it
should come to), `launch` (the controller's check launch), `probes` (runs inside the sandbox,
standard library only), `verdicts` (pure), `report` (human and JSON output). Nothing is imported
here: the probes start inside the sandbox with this package on their path.
"""
