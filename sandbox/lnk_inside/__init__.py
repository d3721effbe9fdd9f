"""What runs INSIDE a sandbox: hostile ground, importing no service (nor lnk_shared: the
standard library only, so the box's Python starts it with `-I -S`).

`probes` (the probe program `lnk sandbox check` boots inside, by a string in the controller's
launch.py) with its steps in `probes_caps`, `probes_left`, `probes_env` and `probes_models`;
`native/` holds the C that runs inside: the confiner (`lnk_sandbox.c`, with the relay,
`relay.c`) and ssh's connector (`lnk_connect.c`), built by lnk_shared/native_build.py. Nothing
is imported here: the
probes start inside the sandbox with this package's folder on their path, and everything they
read there is hostile.
"""
