# The C pass over a model request's body (lnk_proxy/native/json_scan.c; its header says what).
OK: int
NOT_JSON: int
KEY_TWICE: int
TOO_DEEP: int
TOO_MANY: int
LONE_SURROGATE: int
TOO_MANY_KEYS: int
MAX_LEVELS: int
MAX_KEYS: int
FETCH_NAMES: tuple[str, ...]

def scan(body: bytes, max_depth: int, max_values: int, /) -> tuple[int, bool]: ...
def nesting_within(shape: bytes, max_depth: int, /) -> bool: ...

CONTENT_KEYS: tuple[str, ...]
PLAIN_TYPES: tuple[str, ...]

def scan_content(
    body: bytes, max_depth: int, max_values: int, /
) -> tuple[int, bool, tuple[tuple[int, int, int], ...] | None]: ...
