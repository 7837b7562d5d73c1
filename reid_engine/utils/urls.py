"""Database and tracking-store URLs: what log lines may show of them, and the file behind a SQLite one."""
import os
import re
from typing import Optional

__all__ = ["mask_password", "sqlite_file"]

# scheme://user:password@host: the password ends at the "@" (a "/" or a space first: no password)
_URL_PASSWORD = re.compile(r"(//[^/@:\s]*):[^/@\s]*@")
_SQLITE_URL = re.compile(r"^sqlite(\+\w+)?:///(?P<path>[^?]*)")


def mask_password(text: str) -> str:
    """`text` (a URL, or a message quoting URLs) with the password of each ``user:password@`` as ``***``."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


def sqlite_file(url: str) -> Optional[str]:
    """The absolute path of the database file of a ``sqlite[+driver]:///path`` URL; None for another
    database or SQLite in memory."""
    match = _SQLITE_URL.match(url)
    if not match or match.group("path") in ("", ":memory:"):
        return None
    return os.path.abspath(match.group("path"))
