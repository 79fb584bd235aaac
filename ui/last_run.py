"""A task tab's last run as a record: its outcome, the values it ran with, the output it showed,
its rows of tokens, whether its text went to the notebook, and the token clicked in it. The tab
keeps the record in one gr.State (ui/tab.py), which each run replaces and each handler that
speaks of the run reads; nothing is read back from what the page shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from serve.outcome import Outcome


@dataclass(frozen=True)
class TokenRow:
    """One row of the token view: the run's tokens (Result.logprobs' entries, each with its
    alternatives), and what the request that drew them changed of the run's values (a comparison's
    side: serve/comparing.py's side_requests; none for a run of its own), which a run continued from
    one of its tokens is sent with."""
    entries: list[dict]
    asked: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LastRun:
    """The record of a task tab's last run (see the module's docstring); LastRun() before any run."""
    # The last run's outcome, refused or failed too: such a run shows nothing new, so the parts
    # below stay those of the run before it, faded on the page (None: no run yet, or its line gone).
    outcome: Outcome | None = None
    values: dict[str, Any] = field(default_factory=dict)  # inputs, settings and seed, the notebook uncut
    output: str = ""  # its text (Compare: the side the output box shows)
    rows: tuple[TokenRow, ...] = ()  # its tokens, as the token view shows them (none where it kept none)
    # Its text has gone to the notebook: joined as it ran (Continue), or taken by Continue since
    # (join_pending); until then a run's text waits to join it (pending).
    appended: bool = False
    selected: tuple[int, int] | None = None  # (row, index) of the token clicked last
    # A comparison's other side (the output is the side shown): its text and its own outcome, which
    # Chat keeps beside the shown one as another reply to the turn.
    other: tuple[str, Outcome] | None = None

    def with_outcome(self, outcome: Outcome | None) -> "LastRun":
        return replace(self, outcome=outcome)

    def given(self, name: str) -> Any:
        """The value the run was given for input `name` (None: none)."""
        return self.values.get(name)

    def token(self, row: Any, index: Any) -> dict | None:
        """The entry of the token at (row, index) as a click names them; None where none is."""
        if not isinstance(row, int) or not isinstance(index, int) or not 0 <= row < len(self.rows) \
                or not 0 <= index < len(self.rows[row].entries):
            return None
        return self.rows[row].entries[index]

    def pending(self, name: str) -> tuple[str, str] | None:
        """The run's text waiting to join the notebook `name` (a Generate run's, or one continued
        from a chosen token): the input it continued and its output, taken from the run itself, so
        that an edit made while it streamed does not pass for that input; join_pending decides where
        it goes."""
        if self.appended or self.outcome is None or not self.outcome.ran:
            return None
        return self.given(name), self.output
