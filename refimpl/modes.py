"""Forward modes and one explicit predicate per mode.

SGLang's ``ForwardMode`` ([facts#forward-modes]) has grouped predicates with easy-to-miss defaults
(``is_draft_extend()`` silently excludes DRAFT_EXTEND_V2 unless ``include_v2=True``). Here each predicate is true for
one mode alone; the few groupings the graph code needs are named.
"""

from __future__ import annotations

import enum


class ForwardMode(enum.IntEnum):
    EXTEND = enum.auto()  # eager prefill, never captured here
    DECODE = enum.auto()
    IDLE = enum.auto()  # a DP rank with no requests; graphs treat it like decode
    TARGET_VERIFY = enum.auto()
    DRAFT_EXTEND = enum.auto()  # EAGLE v1 draft extend
    DRAFT_EXTEND_V2 = enum.auto()  # EAGLE v2 draft extend ("fixed shape")

    # --- one predicate per mode ------------------------------------------------------------
    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_draft_extend_v1(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND

    def is_draft_extend_v2(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND_V2

    # --- named groupings ----------------------------------------------------------------------
    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_any_draft_extend(self) -> bool:
        """DRAFT_EXTEND or DRAFT_EXTEND_V2 (SGLang: ``is_draft_extend(include_v2=True)``)."""
        return self in (ForwardMode.DRAFT_EXTEND, ForwardMode.DRAFT_EXTEND_V2)

    def is_graph_mode(self) -> bool:
        """Modes a graph runner captures in refimpl (EXTEND always runs eagerly)."""
        return self is not ForwardMode.EXTEND

    @classmethod
    def parse(cls, name: str) -> "ForwardMode":
        """``'target_verify'`` / ``'TARGET_VERIFY'`` / ``'draft_extend_v2'`` -> member."""
        key = name.strip().upper().replace("-", "_")
        if key not in cls.__members__:
            raise ValueError(f"unknown forward mode {name!r}; valid modes: {', '.join(m.label for m in cls)}")
        return cls[key]

    @property
    def label(self) -> str:
        return self.name.lower()


GRAPH_MODES = tuple(m for m in ForwardMode if m.is_graph_mode())
