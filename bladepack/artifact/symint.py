"""How the plan stores a size that may be symbolic (loader-safe).

Note [SymInt encoding]: wherever a size or an attribute may be symbolic, the plan stores either a
plain int or a one-key map {"r": k} meaning "register k of the shape program's result".
"""

from __future__ import annotations

from typing import Union

SymIntEnc = Union[int, dict[str, int]]
