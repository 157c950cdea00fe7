"""Modal screens: help, and the drill-in view of one rank."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """diag top — keys

  1..6         show panel: ranks, collectives, layers, overflow, GPUs, findings
  n            next panel (tab moves the focus)
  s            sort the ranks by the next column (rank, step ms, comm, memory, health)
  r            reverse the sort
  p / space    pause (the display freezes; a replay's clock stops)
  enter        drill into the selected rank
  ?            this help
  q            quit (escape closes a dialog)

Step time is the slowest rank's; comm is a rank's communication share of its last step;
busbw uses nccl-tests' factors for the group size."""


class TextScreen(ModalScreen[None]):
    """A scrollable page of text; escape, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss_screen", "close")]
    DEFAULT_CSS = """
    TextScreen { align: center middle; }
    TextScreen > VerticalScroll { width: 90%; height: 80%; border: round $accent;
                                  background: $surface; padding: 0 1; }
    """

    def __init__(self, text: str, title: str) -> None:
        super().__init__()
        self.text, self.title_text = text, title

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = self.title_text
            yield Static(Text(self.text), id="screen-text")

    def action_dismiss_screen(self) -> None:
        self.dismiss(None)


def help_screen() -> TextScreen:
    return TextScreen(HELP, "help")
