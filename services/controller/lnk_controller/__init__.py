"""lnk box controller: the only privileged service (sandbox lifecycle, leases, specs, agents).

The rule for looking things up for a caller: the controller runs as root, but it never answers
a caller with root's view of the machine. Every lookup made for a caller (each path and program
of a spec, the spec's own path, a `--with-fd` descriptor's path, the program to run and its
`#!` interpreter, the agent's folder, and the reopening of each grant to bind it) is made on
the judging thread with the caller's own file credentials (`as_caller`: its uid, gid and
groups from `SO_PEERCRED`/`SO_PEERGROUPS`). So a path the caller cannot see gets exactly the
answer of one that does not exist, and nothing of it (a link's target, that it exists) is
printed. `/proc/PID/...` of a process that is not the caller's own is answered as missing
(discovery's walk), because root keeps `CAP_SYS_PTRACE` whatever its file ids are. What is
judged is bound as the same object (device, inode, type), opened without following links
(`bound`), or the launch is refused naming the path that changed, before anything of the
sandbox exists.
"""
