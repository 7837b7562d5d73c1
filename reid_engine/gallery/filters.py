"""Search filters: conditions on item metadata, as a mask (faiss) or a Milvus boolean expression.

A `SearchFilter` is a conjunction of clauses ``(field, op, value)`` on numeric fields; the
command line builds it from ``--where "camid != 3"`` strings, ``--time-window START END``
and ``--exclude-same-camera`` (resolved per query from the query's camera). Both back ends
take the same clauses: faiss turns them into a boolean mask over the records, Milvus into
an expression such as ``camid != 3 and time >= 10.0``, so the two filter identically.
"""
import operator
import re
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..utils.errors import UsageError
from .errors import UnknownFieldError
from .records import FIELDS, UNKNOWN, Records

__all__ = ["OPERATORS", "Clause", "SearchFilter", "parse_where", "query_filter"]

OPERATORS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt,
             ">": operator.gt}
Clause = Tuple[str, str, float]
_CLAUSE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(==|!=|<=|>=|<|>)\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$")
_NUMERIC_FIELDS = FIELDS[1:]


def parse_where(texts: Iterable[str]) -> List[Clause]:
    """Clauses from ``FIELD OP NUMBER`` strings (several joined by ``and``), e.g. ``"camid != 3 and time < 60"``.

    Raises:
        UsageError: a string that is not of that form.
    """
    clauses: List[Clause] = []
    for text in texts:
        for part in re.split(r"\s+and\s+", text.strip()):
            match = _CLAUSE.match(part)
            if not match:
                raise UsageError(f"--where {text!r}: {part!r} is not FIELD OP NUMBER (OP one of "
                                 f"{' '.join(OPERATORS)}), e.g. --where 'camid != 3'")
            clauses.append((match.group(1), match.group(2), float(match.group(3))))
    return clauses


@dataclass(frozen=True)
class SearchFilter:
    """A conjunction of clauses on item metadata (empty: everything passes)."""

    clauses: Tuple[Clause, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return bool(self.clauses)

    def check_fields(self, available: Sequence[str]) -> None:
        """Refuse clauses on fields the index lacks (one line naming the field and those it has)."""
        for name, _, _ in self.clauses:
            if name not in available or name == "path":
                have = ", ".join(f for f in available if f != "path") or "none"
                raise UnknownFieldError(f"filter on {name!r}, a field this index lacks (its filterable fields: "
                                        f"{have}): filter on one of those, or rebuild the index from a list file "
                                        f"with a {name} column")

    def mask(self, records: Records) -> np.ndarray:
        """(N,) bool: the records every clause accepts (an UNKNOWN value never passes a clause)."""
        keep = np.ones(len(records), dtype=bool)
        for name, op, value in self.clauses:
            column = getattr(records, name)
            keep &= OPERATORS[op](column, value) & (column != UNKNOWN)
        return keep

    def milvus_expression(self) -> str:
        """The same conditions as a Milvus boolean expression ("" when empty)."""
        parts = []
        for name, op, value in self.clauses:
            literal = repr(float(value)) if name == "time" else str(int(value))
            parts.append(f"({name} {op} {literal} and {name} != {UNKNOWN})")
        return " and ".join(parts)


def query_filter(base: SearchFilter, query_camid: Optional[int] = None, exclude_same_camera: bool = False,
                 time_window: Optional[Tuple[float, float]] = None) -> SearchFilter:
    """`base` plus the per-query conditions: other cameras than the query's, and a time window.

    Raises:
        UsageError: --exclude-same-camera for a query whose camera is unknown.
    """
    clauses = list(base.clauses)
    if exclude_same_camera:
        if query_camid is None or query_camid == UNKNOWN:
            raise UsageError("--exclude-same-camera needs each query's camera: pass --query-camid, or queries "
                             "from a list file or feature file with camids")
        clauses.append(("camid", "!=", float(query_camid)))
    if time_window is not None:
        start, end = time_window
        clauses += [("time", ">=", float(start)), ("time", "<=", float(end))]
    return SearchFilter(tuple(clauses))
