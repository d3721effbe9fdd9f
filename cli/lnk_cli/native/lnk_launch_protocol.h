/* The launch socket's protocol for the C client, written by
 * `python -m lnk_shared.launch_protocol_c` from lnk_shared/launch_protocol.py, where
 * each frame, its fields, limits and order are defined: do not edit it here (a unit
 * test writes it again and compares). */
#ifndef LNK_LAUNCH_PROTOCOL_H
#define LNK_LAUNCH_PROTOCOL_H

#define LNK_LAUNCH_SOCKET "launch.sock"

/* Limits */
#define LNK_MAX_FRAME 1048576 /* a frame's JSON, in bytes, either way */
#define LNK_MAX_FDS 64 /* descriptors passed with one frame */
#define LNK_HEADER_BYTES 4 /* a frame's length, big-endian, before its JSON */
#define LNK_MAX_ARGS 4096 /* arguments to the sandboxed program */
#define LNK_MAX_ARG_BYTES 131072 /* one argument */
#define LNK_MAX_TEXT 4096 /* cwd, path_env and a grant's path, in characters */
#define LNK_MAX_ENV_VALUE 256 /* a terminal or locale variable's value */
#define LNK_MAX_TERMINAL 10000 /* rows and cols are below this */
#define LNK_MAX_STATUS 255 /* an exit frame's status is 0 to this */

/* Frames, by who sends them: the client, then the controller */
#define LNK_FRAME_LAUNCH "launch"
#define LNK_FRAME_APPROVE "approve"
#define LNK_FRAME_DECLINE "decline"
#define LNK_FRAME_OPENED "opened"
#define LNK_FRAME_SIGNAL "signal"
#define LNK_FRAME_APPROVE_QUESTION "approve?"
#define LNK_FRAME_OPEN "open"
#define LNK_FRAME_APPROVED "approved"
#define LNK_FRAME_STARTED "started"
#define LNK_FRAME_EXIT "exit"
#define LNK_FRAME_ERROR "error"

/* The signals a client forwards to the program (<signal.h>'s names) */
#define LNK_FORWARDED_SIGNALS SIGINT, SIGTERM, SIGHUP, SIGQUIT

#endif
