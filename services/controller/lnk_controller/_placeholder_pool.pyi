# A write grant's empty-folder placeholders renamed in from the owner's pool and back, the GIL
# released (lnk_controller/ext/placeholder_pool.c; its header says what each does and does not do).
from lnk_controller._placeholder_calls import Opened

POOLED: int
NOT_POOLED: int
KEPT: int
ERROR: int
MAX_BATCH: int

# (parts, name, content: None for an empty folder, the pool's name to rename in or None)
Entry = tuple[tuple[bytes, ...], bytes, bytes | None, bytes | None]

def take(
    dir_fd: int, pool_fd: int, entries: tuple[Entry, ...], /
) -> tuple[list[Opened], int, list[int]]: ...
def put_back(
    pool_fd: int, pool_uid: int, items: tuple[tuple[bytes, int, int, bytes], ...], /
) -> list[tuple[int, int]]: ...
