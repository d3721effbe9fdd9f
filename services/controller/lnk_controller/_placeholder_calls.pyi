# A write grant's placeholder syscalls in batches, the GIL released
# (lnk_controller/ext/placeholder_calls.c; its header says what each does and does not do).
NOT_THERE: int
KEPT: int
REMOVED: int
ERROR: int
MAX_BATCH: int
MAX_CONTENT: int

# (parts, name, content: None for an empty folder)
Entry = tuple[tuple[bytes, ...], bytes, bytes | None]
# (fd, parent_fd, dev, ino, uid, gid)
Opened = tuple[int, int, int, int, int, int]

def make(dir_fd: int, entries: tuple[Entry, ...], /) -> tuple[list[Opened], int]: ...
def seal(
    items: tuple[tuple[int, int, bytes, int, int, int, int], ...],
    owner_uid: int,
    owner_gid: int,
    /,
) -> tuple[list[bool], int]: ...
def remove(
    items: tuple[tuple[bytes | None, bytes, int, int], ...], contents: tuple[bytes, ...], /
) -> list[tuple[int, int, int]]: ...
