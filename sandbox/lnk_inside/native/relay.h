/* The in-sandbox relay (relay.c). */
#ifndef LNK_RELAY_H
#define LNK_RELAY_H
#include <stdbool.h>
#include <stddef.h>
/* A TCP listener on 127.0.0.1:port of the sandbox's own network namespace; -1 with errno. */
int relay_listen(int port);
/* How long a `[localhost]` connection waits for the proxy's answer before it is closed: past
   the proxy's longest connect timeout (lnk_proxy.config.MAX_CONNECT_TIMEOUT_S, 120 s), so a
   proxy that never answers holds a relay thread this long at most, not for the sandbox's life. */
#define RELAY_HANDSHAKE_MS 130000
/* Detach a relay process (a grandchild, re-parented to bwrap's init so it ends with the
   sandbox) serving each listener: connections to listeners[i] are relayed to the unix socket
   at socket_path; when localhost_ports[i] != 0 the relay first asks the proxy for
   `CONNECT localhost:<port>` and relays only after a 200 that came within handshake_ms. The
   caller's copies of the listeners are closed. 0, or -1 with errno. */
int relay_start(const char *socket_path, const int *listeners, const int *localhost_ports,
                size_t count, int handshake_ms);
/* relay_start, and with `hand_off` each connection of a listener whose localhost_ports[i] is 0
   is handed to the proxy itself (its socket sent over a new connection to socket_path with
   SCM_RIGHTS after HANDOFF_HEADER: the proxy's handoff.py), not relayed; the `[localhost]`
   ports are relayed as before. The confiner uses it for the proxy's listener. */
int relay_start_handing(const char *socket_path, const int *listeners,
                        const int *localhost_ports, size_t count, int handshake_ms,
                        bool hand_off);
/* The bytes before the handed socket: the proxy's handoff.HEADER (NUL first: never HTTP). */
#define HANDOFF_HEADER "\0lnk-fd1"
#define HANDOFF_HEADER_LEN 8
/* `lnk-sandbox --relay SOCKET PORT`: serve 127.0.0.1:PORT in the foreground until killed
   (the proxy benchmark runs the relay this way); `--relay-handoff` hands each connection to
   the proxy as relay_start_handing does. Returns an exit status. */
int relay_main(int argc, char **argv);
#endif
